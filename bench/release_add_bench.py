#!/usr/bin/env python3
"""Issue 81: `release add` of a real Python release (a venv with Django and gunicorn, ~6 500
files, ~70 MB) against what a user would otherwise do, `cp -a SRC DST && sync -f DST`, and
against an older rollgate (OLD) — idle, and with a writer loading the disk beside it (64 MiB
written and fsynced, again and again). Then `release rm` of such a release, against `rm -rf`.
Interleaved rounds; medians in seconds.

Usage: python3 bench/release_add_bench.py NEW OLD TREE [ROUNDS]
  TREE: a release folder (a Procfile with a `web:` line and the venv), e.g. made by
    python3 -m venv T/venv && T/venv/bin/pip install django gunicorn 'psycopg[binary]'
    ln -sf /usr/bin/python3 T/venv/bin/python3; echo 'web: venv/bin/python -m gunicorn app:app' > T/Procfile
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def timed(command):
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


class Writer:
    """Loads the disk: 64 MiB written and fsynced, over and over, until stopped."""

    def __init__(self, folder):
        self.path = os.path.join(folder, "load")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        block = b"\0" * (1 << 20)
        while not self.stop.is_set():
            with open(self.path, "wb") as out:
                for _ in range(64):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        os.unlink(self.path)


def main():
    new, old, tree = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    work = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(tree)) or None)
    times = {}
    try:
        for load in ["idle", "loaded"]:
            for n in range(rounds):
                with (Writer(work) if load == "loaded" else open(os.devnull)):
                    copy = os.path.join(work, f"copy-{load}-{n}")
                    times.setdefault((load, "cp -a && sync -f"), []).append(
                        timed(["sh", "-c", f'cp -a "$0" "$1" && sync -f "$1"', tree, copy]))
                    for name, binary in [("rollgate release add", new), ("older rollgate", old)]:
                        root = os.path.join(work, f"root-{name[:3]}-{load}-{n}")
                        os.makedirs(root)
                        times.setdefault((load, name), []).append(timed(
                            [binary, "release", "add", "shop", "v1", tree, "--root", root]))
                    times.setdefault((load, "rm -rf"), []).append(timed(["rm", "-rf", copy]))
                    for name, binary in [("rollgate release rm", new), ("older release rm", old)]:
                        root = os.path.join(work, f"root-{'rol' if binary == new else 'old'}-{load}-{n}")
                        times.setdefault((load, name), []).append(timed(
                            [binary, "release", "rm", "v1", "--root", root]))
                    shutil.rmtree(os.path.join(work, f"root-rol-{load}-{n}"), ignore_errors=True)
                    shutil.rmtree(os.path.join(work, f"root-old-{load}-{n}"), ignore_errors=True)
        print("| load | what | median s | rounds |")
        print("| --- | --- | --- | --- |")
        for (load, name), seen in times.items():
            rounds_text = " ".join(f"{t:.2f}" for t in seen)
            print(f"| {load} | {name} | {statistics.median(seen):.2f} | {rounds_text} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
