"""Writes hostile .tgz archives for `rollgate release add` to refuse, one case each, into the
folder given (tests/it/release_add.rs), for a deploy root (the second argument) that links must not
reach. Python's tarfile writes entries no well-behaved tar makes: absolute names, `..`, links out,
devices, a header that lies about its size."""
import gzip, io, os, sys, tarfile
out = sys.argv[1]
root = sys.argv[2]
exe = b"#!/bin/sh\nexit 0\n"
def member(name, kind=tarfile.REGTYPE, data=b"", link="", mode=0o755, size=None):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    info.size = len(data) if size is None else size
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)
def archive(case, members, fmt=tarfile.GNU_FORMAT):
    path = os.path.join(out, case + ".tgz")
    with tarfile.open(path, "w:gz", format=fmt) as t:
        t.addfile(*member("edge-svc", data=exe))
        for m in members:
            t.addfile(*m)
cases = {
    "absolute": [member("/tmp/evil", data=b"x")],
    "dotdot": [member("../evil", data=b"x")],
    "dotdot-inside": [member("conf/../../evil", data=b"x")],
    # An absolute link is a release's own business (a venv's interpreter), but not into the root.
    "symlink-absolute": [member("db", tarfile.SYMTYPE, link=root + "/secrets/db")],
    "symlink-into-release": [member("v1", tarfile.SYMTYPE, link=root + "/releases/../releases/v1")],
    "write-through-absolute-symlink": [member("d", tarfile.SYMTYPE, link="/tmp"), member("d/evil", data=b"x")],
    "symlink-up": [member("up", tarfile.SYMTYPE, link="../../outside")],
    "symlink-deep-up": [member("a/b/c", tarfile.SYMTYPE, link="../../../x")],
    "hardlink-absolute": [member("pw", tarfile.LNKTYPE, link="/etc/passwd")],
    "hardlink-up": [member("pw", tarfile.LNKTYPE, link="../outside")],
    "hardlink-missing": [member("pw", tarfile.LNKTYPE, link="nothing-here")],
    "char-device": [member("tty", tarfile.CHRTYPE)],
    "block-device": [member("sda", tarfile.BLKTYPE)],
    "fifo": [member("pipe", tarfile.FIFOTYPE)],
    "replaces-record": [member("release.json", data=b"{}")],
    "replaces-record-in-top-folder": [member("app/release.json", data=b"{}")],
    "write-through-symlink": [member("d", tarfile.SYMTYPE, link="."), member("d/edge-svc", data=b"x")],
    "duplicate-entry": [member("edge-svc", data=b"#!/bin/sh\nexit 1\n")],
    "too-big": [member("big", data=b"y" * 4096)],
    "too-many": [member("f%d" % i, data=b"z") for i in range(12)],
    "pax-absolute": [member("/etc/cron.d/evil", data=b"x")],
}
for case, members in cases.items():
    archive(case, members, tarfile.PAX_FORMAT if case.startswith("pax") else tarfile.GNU_FORMAT)
# No executable at all, and an executable without its exec bit.
with tarfile.open(os.path.join(out, "no-executable.tgz"), "w:gz") as t:
    t.addfile(*member("other", data=exe))
with tarfile.open(os.path.join(out, "not-executable.tgz"), "w:gz") as t:
    t.addfile(*member("edge-svc", data=exe, mode=0o644))
# A header that claims 3 GiB with no content behind it.
header = tarfile.TarInfo("edge-svc"); header.size = 3 << 30; header.mode = 0o755
open(os.path.join(out, "claims-3-gib.tgz"), "wb").write(gzip.compress(header.tobuf()))
# Cut in the middle; gzip garbage; a plain tar named .tgz; an empty file.
whole = open(os.path.join(out, "fifo.tgz"), "rb").read()
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w") as t:
    t.addfile(*member("edge-svc", data=exe * 4000))
plain = raw.getvalue()
open(os.path.join(out, "truncated.tgz"), "wb").write(gzip.compress(plain)[: len(gzip.compress(plain)) // 2])
open(os.path.join(out, "garbage.tgz"), "wb").write(b"\x1f\x8b\x08\x00" + os.urandom(600))
open(os.path.join(out, "plain-tar.tgz"), "wb").write(plain)
open(os.path.join(out, "empty.tgz"), "wb").write(b"")
