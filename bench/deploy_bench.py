#!/usr/bin/env python3
"""Deploy latency benchmark: many real deploys on 127.0.0.1, percentiles of
  - switch delay: the candidate's /readyz turning 200 -> the `current` rename (promoted_at),
  - exit delay: the candidate's exit -> the `rolled_back` line's ts,
  - deadline overshoot: rolled_back elapsed_ms - deadline for a never-ready candidate,
and rollgate's peak RSS during a deploy (from /usr/bin/time).

Usage: python3 bench/deploy_bench.py ROLLGATE RUNS
"""
import json, os, re, statistics, subprocess, sys, tempfile

from benchlib import free_port, pct, stop_keepers

rollgate, runs = sys.argv[1], int(sys.argv[2])
POLL_MS, DEADLINE_MS = 100, 1000


def release(root, version, knobs):
    d = os.path.join(root, "releases", version); os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "svc")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec '{rollgate}' sample-service {knobs}\n")
    os.chmod(path, 0o755)


def deploy(root, version, extra=()):
    out = subprocess.run(["/usr/bin/time", "-f", "%M", rollgate, "deploy", "svc", str(free_port()), version,
                          "--root", root, "--grace-ms", "2000", *extra], capture_output=True, text=True)
    rss_kb = int(out.stderr.strip().splitlines()[-1])
    return out.returncode, rss_kb


def last_log(root):
    with open(os.path.join(root, "deploy.log")) as f:
        return json.loads(f.read().splitlines()[-1])


def output_value(root, version, pattern):
    with open(os.path.join(root, "releases", version, "svc.output")) as f:
        return float(re.search(pattern, f.read()).group(1))


switch, exits, overshoot, rss = [], [], [], []
with tempfile.TemporaryDirectory() as root:
    for i in range(runs):
        # Ready at a random offset within a poll interval, so the wait for the next poll varies.
        v = f"g{i}"; release(root, v, f"--ready-after-ms {150 + (i * 37) % POLL_MS}")
        code, kb = deploy(root, v, ["3000"]); assert code == 0, code; rss.append(kb)
        with open(os.path.join(root, "current")) as f:
            promoted_at = json.load(f)["promoted_at"]
        switch.append((promoted_at - output_value(root, v, r"ready from ([0-9.]+)")) * 1000)

        v = f"x{i}"; release(root, v, f"--ready-after-ms 600000 --exit-after-ms {200 + (i * 13) % POLL_MS} --exit-code 78")
        code, kb = deploy(root, v, ["5000"]); assert code == 1, code; rss.append(kb)
        exits.append((last_log(root)["ts"] - output_value(root, v, r"at ([0-9.]+)\n")) * 1000)

        v = f"n{i}"; release(root, v, "--ready-after-ms 600000")
        code, kb = deploy(root, v, [str(DEADLINE_MS)]); assert code == 1, code; rss.append(kb)
        overshoot.append(last_log(root)["elapsed_ms"] - DEADLINE_MS)
    with open(os.path.join(root, "current")) as f:
        pid = json.load(f)["pid"]
    stop_keepers(root)
    os.killpg(pid, 15)

for name, xs, goal in [("switch delay (ready -> rename), ms", switch, f"p95 <= {POLL_MS + 10}"),
                       ("exit -> rolled_back line, ms", exits, "p95 <= 20"),
                       ("deadline overshoot, ms", overshoot, "p95 <= 50")]:
    print(f"{name}: n={len(xs)} p50={pct(xs,50):.1f} p95={pct(xs,95):.1f} max={max(xs):.1f}  (goal {goal})")
print(f"rollgate peak RSS per deploy: median {statistics.median(rss)/1024:.1f} MiB, max {max(rss)/1024:.1f} MiB")
