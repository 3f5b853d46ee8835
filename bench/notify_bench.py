#!/usr/bin/env python3
"""Readiness by notification against readiness by polling, side by side in one run.

Usage: python3 bench/notify_bench.py ROLLGATE [ROUNDS] [GATE_S]

Latency, ROUNDS rounds (30 by default), interleaved: a real `rollgate deploy` of a sample
service that becomes ready 150-250 ms after its start, gated either by the default HTTP probe
(`GET /readyz` every poll_ms = 100 ms, the default) or by `probe = { kind = 'notify }`. The
figure is the time from the release being ready (the moment /readyz turns 200, or the moment
READY=1 was sent, both printed by the service in Unix time) to `ROOT/current` being renamed,
seen by an inotify watch on the root (IN_MOVED_TO), as a proxy reading `current` would see it.

CPU, one never-ready candidate per kind with a GATE_S-second deadline (30 by default):
rollgate's own user + system time during that gate, read from /proc/PID/stat (its children's
time is not in it).
"""
import ctypes
import ctypes.util
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import free_port, pct, stop_keepers

rollgate = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
gate_s = int(sys.argv[3]) if len(sys.argv) > 3 else 30
TICKS = os.sysconf("SC_CLK_TCK")


class Renames(threading.Thread):
    """Unix times at which a file named `current` was moved into `root` (inotify)."""

    IN_MOVED_TO = 0x00000080

    def __init__(self, root):
        super().__init__(daemon=True)
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init()
        if self.fd < 0 or libc.inotify_add_watch(self.fd, root.encode(), self.IN_MOVED_TO) < 0:
            sys.exit("inotify is not available")
        self.times = []

    def run(self):
        while True:
            data = os.read(self.fd, 4096)
            now = time.time()
            offset = 0
            while offset < len(data):
                _, _, _, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16:offset + 16 + length].rstrip(b"\0")
                if name == b"current":
                    self.times.append(now)
                offset += 16 + length


def release(root, version, knobs):
    folder = os.path.join(root, "releases", version)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "svc")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec '{rollgate}' sample-service {knobs}\n")
    os.chmod(path, 0o755)


def said(root, version, words):
    with open(os.path.join(root, "releases", version, "svc.output")) as f:
        for line in f:
            if words in line:
                return float(line.rsplit(" ", 1)[1])
    raise SystemExit(f"{version}: no '{words}' line in its output")


def policy(root, kind, deadline_ms):
    path = os.path.join(root, f"{kind}.json")
    probe = {"kind": kind}
    with open(path, "w") as f:
        json.dump({"svc": {"progress_deadline_ms": deadline_ms, "poll_ms": 100,
                           "max_unavailable_pct": 0, "max_surge_pct": 100,
                           "on_stall": "rollback", "stop_grace_ms": 2000, "watch_ms": 0,
                           "probe": probe}}, f)
    return path


def deploy(root, version, kind, deadline_ms):
    return subprocess.Popen([rollgate, "deploy", "svc", str(free_port()), version, "--root", root,
                             "--policy", policy(root, kind, deadline_ms)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def own_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


latency = {"http": [], "notify": []}
cpu = {}
with tempfile.TemporaryDirectory() as root:
    renames = Renames(root)
    renames.start()
    for i in range(rounds):
        offset = 150 + (i * 37) % 100
        for kind in ("http", "notify") if i % 2 == 0 else ("notify", "http"):
            version = f"{kind}{i}"
            knobs = f"--ready-after-ms {offset}"
            if kind == "notify":
                # /readyz never answers 200: READY=1 alone can pass the gate.
                knobs += " --notify --readyz-status 503"
            release(root, version, knobs)
            seen = len(renames.times)
            child = deploy(root, version, kind, 3000)
            if child.wait() != 0:
                sys.exit(f"{version}: deploy exited {child.returncode}")
            while len(renames.times) == seen:
                time.sleep(0.001)
            ready = said(root, version, "READY=1 sent at" if kind == "notify" else "ready from")
            latency[kind].append((renames.times[seen] - ready) * 1000)

    for kind in ("http", "notify"):
        version = f"never-{kind}"
        release(root, version, "--readyz-status 503" + (" --notify --ready-after-ms 600000"
                                                         if kind == "notify" else ""))
        child = deploy(root, version, kind, gate_s * 1000)
        last = 0.0
        while child.poll() is None:
            try:
                last = own_cpu_seconds(child.pid)
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.1)
        cpu[kind] = last
    stop_keepers(root)
    with open(os.path.join(root, "current")) as f:
        os.killpg(json.load(f)["pid"], 15)

print(f"{rounds} rounds each, interleaved; ready -> `current` renamed (inotify), ms:")
print("| probe | p50 | p95 | max |")
print("| --- | --- | --- | --- |")
for kind, name in (("http", "HTTP GET /readyz, poll 100 ms"), ("notify", "notify (READY=1)")):
    xs = latency[kind]
    print(f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 95):.1f} | {max(xs):.1f} |")
print(f"rollgate's own CPU during a {gate_s} s gate that never passes: "
      f"HTTP poll 100 ms {cpu['http'] * 1000:.0f} ms, notify {cpu['notify'] * 1000:.0f} ms")
