#!/usr/bin/env python3
"""Rollouts of 10 and 50 replicas behind `rollgate proxy` under load: requests served, failures,
latency during the rollout against steady state, and what rollgate itself costs per replica.

Usage: OHA=/path/to/oha bench/rollout_bench.py ROLLGATE [REPLICAS...]   (default 10 50)

For each size: install version a on N replicas; start the proxy; measure steady state with
`oha --no-tui -q RATE -c 8 -z 5s`; roll a → b once with no load (its wall time sets the loaded
run's length, and its CPU is rollgate's own: the replicas it starts outlive it and are not its
reaped children); then roll b → a under the same load for that long plus a second. Waves 1, 10,
50, 100 %, 500 ms soak, a 2 s watch after the last wave, the default 100 ms poll, releases ready
as soon as they listen.
"""

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from benchlib import free_port, port_block, port_free, stop_keepers

RATE = int(os.environ.get("RATE", "2000"))
SOAK_MS = 500
# After the last wave the new replicas are watched (as a soak) before the rollout is promoted.
WATCH_MS = 2000


# oha cuts the requests still in flight when its -z time is up: its own ending, not a failure.
CUT_BY_OHA = "aborted due to deadline"


def figures(report):
    codes = report.get("statusCodeDistribution", {})
    errors = {k: n for k, n in report.get("errorDistribution", {}).items() if k != CUT_BY_OHA}
    pct = report["latencyPercentiles"]
    return {"served": sum(codes.values()),
            "failed": sum(n for code, n in codes.items() if code != "200") + sum(errors.values()),
            "p50_ms": pct["p50"] * 1000, "p99_ms": pct["p99"] * 1000, "errors": errors}


def oha(oha_path, port, seconds):
    out = subprocess.run(
        [oha_path, "--no-tui", "-q", str(RATE), "-c", "8", "-z", f"{seconds}s",
         "--output-format", "json", f"http://127.0.0.1:{port}/"],
        capture_output=True, text=True, check=True)
    return figures(json.loads(out.stdout))


def rollout(rollgate, root, version, extra=()):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    out = subprocess.run([rollgate, "rollout", "edge-svc", version, "--root", root,
                          "--waves", "1,10,50,100", "--soak", f"{SOAK_MS}ms",
                          "--watch-ms", str(WATCH_MS), *extra],
                         capture_output=True, text=True)
    wall = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"rollout to {version}: exit {out.returncode}: {out.stdout}{out.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def one_size(rollgate, oha_path, replicas):
    root = tempfile.mkdtemp(prefix=f"rollgate-rollout-bench-{replicas}-")
    for version in ("a", "b"):
        d = os.path.join(root, "releases", version)
        os.makedirs(d)
        path = os.path.join(d, "edge-svc")
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nexec '{rollgate}' sample-service\n")
        os.chmod(path, 0o755)
    surge = -(-replicas * 25 // 100)
    ports = port_block(replicas + surge + 4)
    subprocess.run([rollgate, "rollout", "edge-svc", "a", "--root", root, "--replicas",
                    str(replicas), "--ports", ports, "--deadline-ms", "60000"],
                   capture_output=True, check=True)
    proxy_port = free_port()
    proxy = subprocess.Popen([rollgate, "proxy", "--listen", f"127.0.0.1:{proxy_port}",
                              "--root", root], stderr=subprocess.DEVNULL)
    try:
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", proxy_port)) == 0:
                    break
            time.sleep(0.01)
        steady = oha(oha_path, proxy_port, 5)
        quiet_wall, quiet_cpu = rollout(rollgate, root, "b")
        waves = len(json.load(open(os.path.join(root, "rollout.json")))["waves"])
        seconds = int(quiet_wall) + 2
        load = subprocess.Popen(
            [oha_path, "--no-tui", "-q", str(RATE), "-c", "8", "-z", f"{seconds}s",
             "--output-format", "json", f"http://127.0.0.1:{proxy_port}/"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(0.5)
        loaded_wall, loaded_cpu = rollout(rollgate, root, "a")
        during = figures(json.loads(load.communicate()[0]))
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait()
        pool = json.load(open(os.path.join(root, "replicas.json")))["replicas"]
        stop_keepers(root)
        for r in pool:
            try:
                os.killpg(r["pid"], signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(root, ignore_errors=True)
    soaks = ((waves - 1) * SOAK_MS + WATCH_MS) / 1000
    print(f"== {replicas} replicas (surge {surge}, {waves} waves, {SOAK_MS} ms soak, "
          f"load {RATE} req/s, 8 connections)")
    print(f"steady state: {steady['served']} requests, {steady['failed']} failed, "
          f"p50 {steady['p50_ms']:.2f} ms, p99 {steady['p99_ms']:.2f} ms")
    print(f"during the rollout ({loaded_wall:.2f} s): {during['served']} requests, "
          f"{during['failed']} failed, p50 {during['p50_ms']:.2f} ms, "
          f"p99 {during['p99_ms']:.2f} ms {during['errors'] or ''}")
    print(f"rollout with no load: {quiet_wall:.2f} s wall, of which {soaks:.1f} s soak and watch; "
          f"{(quiet_wall - soaks) / replicas * 1000:.0f} ms wall per replica beyond the soak; "
          f"rollgate CPU {quiet_cpu * 1000:.0f} ms ({quiet_cpu / replicas * 1000:.1f} ms per "
          f"replica); under load {loaded_wall:.2f} s wall, CPU {loaded_cpu * 1000:.0f} ms")
    return during["failed"]


def main():
    rollgate = os.path.abspath(sys.argv[1])
    oha_path = os.environ.get("OHA", "oha")
    sizes = [int(n) for n in sys.argv[2:]] or [10, 50]
    failed = sum(one_size(rollgate, oha_path, n) for n in sizes)
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
