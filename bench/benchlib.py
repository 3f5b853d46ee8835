"""Helpers the Python benchmarks share (import it from a script in bench/: Python puts the
script's folder on the import path). Ports come from the kernel, so a benchmark never takes a
port someone else listens on."""

import os
import socket


def free_port():
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port):
    """Whether 127.0.0.1:PORT can be bound now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def port_block(count):
    """COUNT free ports in a row, as rollgate's `--ports FIRST-LAST` takes them."""
    while True:
        first = free_port()
        if first + count < 65000 and all(port_free(p) for p in range(first, first + count)):
            return f"{first}-{first + count - 1}"


def pct(xs, p):
    """The P-th percentile of XS, interpolated between the two nearest ranks."""
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def sample_release(root, version, rollgate):
    """releases/VERSION/edge-svc in ROOT: a launcher of ROLLGATE's sample-service."""
    import os
    d = os.path.join(root, "releases", version)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "edge-svc")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec '{rollgate}' sample-service\n")
    os.chmod(path, 0o755)


def started_to_switch(root):
    """Milliseconds from the last `candidate_started` in ROOT's log to `current`'s promoted_at."""
    import json, os
    with open(os.path.join(root, "deploy.log")) as f:
        lines = [json.loads(l) for l in f.read().splitlines()]
    started = [l for l in lines if l["event"] == "candidate_started"][-1]["ts"]
    with open(os.path.join(root, "current")) as f:
        return (json.load(f)["promoted_at"] - started) * 1000


def stop_keepers(root):
    """Ends ROOT's keepers (SIGTERM: each leaves its release running) so that the releases
    stopped next are not started again. Only processes that are keepers are signalled."""
    import signal
    import time
    folder = os.path.join(root, ".keepers")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    signalled = []
    for name in names:
        try:
            pid = int(name)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[1:2] != [b"keep"]:
                    continue
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except (ValueError, OSError):
            pass
    deadline = time.time() + 5
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in signalled):
        time.sleep(0.05)
