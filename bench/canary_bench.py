#!/usr/bin/env python3
"""The traffic judge (issue 38): eight replicas behind `rollgate proxy` under a steady, bounded
load (`oha -q RATE`), and rollouts whose canary (one replica: waves 13, 100 %) is judged by the
policy's `analysis` with its defaults (min_requests 200, interval 5 s, confidence 0.99) and
`on_fail = 'rollback`:

- BAD runs of a canary answering 3 % of users with 500 (`sample-service --error-rate 0.03`),
  and BAD runs of one 60 ms slower (`--added-latency-ms 60`): each must be stopped (rolled
  back) within 30 s of the canary reaching min_requests. That moment is read from the proxy's
  own counts (`counts` on ROOT/proxy.sock, sampled every 100 ms by this script).
- SAME runs of an identical canary: each must be promoted, no look failing (a false stop).
- One run at 2 requests per second: every look inconclusive, none failing, promoted.

Usage: OHA=/path/to/oha bench/canary_bench.py ROLLGATE [BAD] [SAME]   (default 10 30)
It starts the replicas, the proxy and oha itself and stops those, by pid and process group.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import free_port, port_block, stop_keepers

RATE = int(os.environ.get("RATE", "400"))
REPLICAS = 8
SOAK_MS = int(os.environ.get("SOAK_MS", "30000"))
MIN_REQUESTS = 200


def counts(root):
    """The proxy's counts (None if it does not answer)."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(os.path.join(root, "proxy.sock"))
            s.sendall(b"counts\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)
    except (OSError, ValueError):
        return None


def requests_of(line, version):
    total = 0
    for r in (line or {}).get("releases", []):
        if r["release"] == version:
            total += sum(r["answers"].values()) + sum(r["misses"].values())
    return total


class Watcher(threading.Thread):
    """Samples the canary's request count; records when it first reaches MIN_REQUESTS."""

    def __init__(self, root, version):
        super().__init__(daemon=True)
        self.root, self.version = root, version
        self.start_count = requests_of(counts(root), version)
        self.reached = None
        self.stop = False

    def run(self):
        while not self.stop and self.reached is None:
            if requests_of(counts(self.root), self.version) - self.start_count >= MIN_REQUESTS:
                self.reached = time.time()
            time.sleep(0.1)


def release(root, rollgate, version, flags):
    folder = os.path.join(root, "releases", version)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "edge-svc")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {rollgate} sample-service {flags}\n")
    os.chmod(path, 0o755)


def policy(root, soak_ms):
    path = os.path.join(root, "policy.json")
    with open(path, "w") as f:
        json.dump({"edge_svc": {
            "progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 25, "on_stall": "rollback", "replicas": REPLICAS,
            "waves": [13, 100], "soak_ms": soak_ms, "watch_ms": 0,
            "analysis": {"on_fail": "rollback"}}}, f)
    return path


def log_lines(root):
    with open(os.path.join(root, "deploy.log")) as f:
        return [json.loads(line) for line in f if line.strip()]


def one_run(rollgate, root, version, policy_path):
    """Rolls out `version`; returns (exit code, wall s, reached min_requests at, ended at,
    the run's analysis lines)."""
    seen = len(log_lines(root))
    watcher = Watcher(root, version)
    watcher.start()
    began = time.time()
    done = subprocess.run([rollgate, "rollout", "edge-svc", version, "--root", root,
                           "--policy", policy_path], capture_output=True, text=True)
    ended = time.time()
    watcher.stop = True
    lines = log_lines(root)[seen:]
    looks = [l for l in lines if l["event"] == "analysis" and l["version"] == version]
    return done.returncode, ended - began, watcher.reached, ended, looks, done.stderr


def main():
    rollgate = os.path.abspath(sys.argv[1])
    oha = os.environ.get("OHA", "oha")
    bad = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    same = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    root = tempfile.mkdtemp(prefix="canary-bench-")
    release(root, rollgate, "base", "")
    subprocess.run([rollgate, "rollout", "edge-svc", "base", "--root", root, "--replicas",
                    str(REPLICAS), "--ports", port_block(REPLICAS * 2 + 4)],
                   capture_output=True, check=True)
    proxy_port = free_port()
    proxy = subprocess.Popen([rollgate, "proxy", "--listen", f"127.0.0.1:{proxy_port}",
                              "--root", root], stderr=subprocess.DEVNULL)
    load = None
    results = {"5xx": [], "latency": [], "same": [], "thin": []}
    try:
        while counts(root) is None:
            time.sleep(0.05)
        load = subprocess.Popen([oha, "--no-tui", "-q", str(RATE), "-c", "16", "-z", "100000s",
                                 f"http://127.0.0.1:{proxy_port}/"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        path = policy(root, SOAK_MS)
        n = 0
        plan = ([("5xx", "--error-rate 0.03")] * bad + [("latency", "--added-latency-ms 60")] * bad
                + [("same", "")] * same)
        for kind, flags in plan:
            n += 1
            version = f"{kind}-{n}"
            release(root, rollgate, version, flags)
            code, wall, reached, ended, looks, err = one_run(rollgate, root, version, path)
            verdicts = [l["analysis"]["verdict"] for l in looks]
            after = None if reached is None else ended - reached
            results[kind].append((code, wall, after, verdicts, looks[-1]["detail"] if looks else err))
            print(f"{kind} run {n}: exit {code} in {wall:.1f} s; canary reached {MIN_REQUESTS} "
                  f"requests {'never' if after is None else f'{after:.1f} s before the end'}; "
                  f"looks {verdicts}", file=sys.stderr)
        # Two requests a second: replace the load.
        load.send_signal(signal.SIGINT)
        load.wait()
        load = subprocess.Popen([oha, "--no-tui", "-q", "2", "-c", "1", "-z", "100000s",
                                 f"http://127.0.0.1:{proxy_port}/"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        release(root, rollgate, "thin", "")
        code, wall, _, _, looks, err = one_run(rollgate, root, "thin", path)
        results["thin"].append((code, wall, None, [l["analysis"]["verdict"] for l in looks],
                                looks[-1]["detail"] if looks else err))
    finally:
        if load is not None:
            load.send_signal(signal.SIGINT)
            load.wait()
        proxy.send_signal(signal.SIGTERM)
        proxy.wait()
        try:
            pool = json.load(open(os.path.join(root, "replicas.json")))["replicas"]
        except (OSError, ValueError):
            pool = []
        stop_keepers(root)
        for r in pool:
            try:
                os.killpg(r["pid"], signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(root, ignore_errors=True)

    print(f"== {REPLICAS} replicas, {RATE} req/s (oha -c 16), canary of one, soak {SOAK_MS} ms, "
          f"analysis defaults with on_fail 'rollback")
    for kind in ("5xx", "latency"):
        runs = results[kind]
        stopped = [r for r in runs if r[0] == 1 and r[3] and r[3][-1] == "fail"
                   and r[2] is not None and r[2] <= 30]
        slowest = max((r[2] for r in runs if r[2] is not None), default=float("nan"))
        print(f"{kind} canary: stopped within 30 s of reaching {MIN_REQUESTS} requests in "
              f"{len(stopped)} of {len(runs)} runs (slowest {slowest:.1f} s after); "
              f"e.g. {runs[0][4] if runs else ''}")
    same_runs = results["same"]
    false_stops = [r for r in same_runs if r[0] != 0 or "fail" in r[3]]
    looks = sum(len(r[3]) for r in same_runs)
    print(f"identical canary: {len(false_stops)} false stops in {len(same_runs)} runs "
          f"({looks} looks; the procedure bounds a soak's false-stop chance by 1 %)")
    for r in false_stops:
        print(f"  false stop: exit {r[0]}: {r[4]}")
    thin = results["thin"][0] if results["thin"] else None
    if thin:
        print(f"2 req/s: exit {thin[0]}, looks {thin[3]}")
    ok = (all(len([r for r in results[k] if r[0] == 1]) == len(results[k]) for k in ("5xx", "latency"))
          and not false_stops and thin and thin[0] == 0 and "fail" not in thin[3])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
