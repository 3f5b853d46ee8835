#!/usr/bin/env python3
"""What confinement costs a deploy (issue 59): time from `candidate_started` to the switch
(`current`'s promoted_at, no watch), for the same release confined (the default: its own cgroup,
no privileges) and unconfined (`isolation.enabled = false`), interleaved in one run so the
machine's load falls on both alike. Prints the median and p90 of each and the median difference.

Usage: python3 bench/confine_bench.py ROLLGATE RUNS
"""
import json, os, subprocess, sys, tempfile

from benchlib import port_block, pct, sample_release, started_to_switch

rollgate, runs = sys.argv[1], int(sys.argv[2])


def policy(root, enabled):
    path = os.path.join(root, f"policy-{enabled}.json")
    with open(path, "w") as f:
        json.dump({"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 50, "max_unavailable_pct": 0,
                                "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
                                "keep_releases": 0, "isolation": {"enabled": enabled}}}, f)
    return path


took = {True: [], False: []}
with tempfile.TemporaryDirectory() as root:
    ports = port_block(2)
    policies = {enabled: policy(root, enabled) for enabled in (True, False)}
    for i in range(runs):
        for enabled in ((True, False) if i % 2 == 0 else (False, True)):
            v = f"v{i}-{enabled}"; sample_release(root, v, rollgate)
            out = subprocess.run([rollgate, "deploy", "edge-svc", v, "--ports", ports, "--root", root,
                                  "--policy", policies[enabled]], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            took[enabled].append(started_to_switch(root))
    subprocess.run(["sh", "-c", f". '{os.path.dirname(os.path.abspath(__file__))}/lib.sh'; stop_releases '{root}'"])

for enabled, name in ((True, "confined"), (False, "unconfined")):
    xs = took[enabled]
    print(f"{name:11} start -> switch: median {pct(xs, 50):.1f} ms, p90 {pct(xs, 90):.1f} ms (n={len(xs)})")
print(f"median difference (confined - unconfined): {pct(took[True], 50) - pct(took[False], 50):+.1f} ms")
