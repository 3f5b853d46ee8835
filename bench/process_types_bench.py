#!/usr/bin/env python3
"""What a release's other process types cost its deploy (issue 69): the wall time of
`rollgate deploy` from its start to its exit (promoted; no watch) for web alone, and for web with
two workers and a singleton clock (each type held `min_ready_ms` = 200 before it counts as ready;
the clock started only once the rest is ready), interleaved in one run so the machine's load falls
on both alike. Every deploy replaces the live release's processes. Prints the median and p90 of
each, and the median difference.

Usage: python3 bench/process_types_bench.py ROLLGATE RUNS
"""
import json, os, subprocess, sys, tempfile, time

from benchlib import pct, port_block, sample_release

rollgate, runs = sys.argv[1], int(sys.argv[2])
LOOP = "trap 'exit 0' TERM\nwhile :; do sleep 1; done\n"


def policy(root, typed):
    entry = {"progress_deadline_ms": 5000, "poll_ms": 50, "max_unavailable_pct": 0,
             "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0, "keep_releases": 0}
    if typed:
        entry["processes"] = {"worker": {"replicas": 2, "min_ready_ms": 200},
                              "clock": {"singleton": True, "min_ready_ms": 200}}
    path = os.path.join(root, "policy.json")
    with open(path, "w") as f:
        json.dump({"edge_svc": entry}, f)
    return path


def release(root, version, typed):
    sample_release(root, version, rollgate)
    if typed:
        folder = os.path.join(root, "releases", version)
        with open(os.path.join(folder, "Procfile"), "w") as f:
            f.write("worker: exec sh loop.sh\nclock: exec sh loop.sh\n")
        with open(os.path.join(folder, "loop.sh"), "w") as f:
            f.write(LOOP)


took = {False: [], True: []}
with tempfile.TemporaryDirectory() as web_root, tempfile.TemporaryDirectory() as typed_root:
    roots = {False: web_root, True: typed_root}
    ports = {typed: port_block(2) for typed in (False, True)}
    policies = {typed: policy(roots[typed], typed) for typed in (False, True)}
    for i in range(runs):
        for typed in ((False, True) if i % 2 == 0 else (True, False)):
            root, v = roots[typed], f"v{i}"
            release(root, v, typed)
            began = time.monotonic()
            out = subprocess.run([rollgate, "deploy", "edge-svc", v, "--ports", ports[typed], "--root", root,
                                  "--policy", policies[typed]], capture_output=True, text=True)
            took[typed].append((time.monotonic() - began) * 1000)
            assert out.returncode == 0, out.stderr
    here = os.path.dirname(os.path.abspath(__file__))
    for root in roots.values():
        subprocess.run([rollgate, "stop", "edge-svc", "--root", root], capture_output=True)
        subprocess.run(["sh", "-c", f". '{here}/lib.sh'; stop_releases '{root}'"])

for typed, name in ((False, "web alone"), (True, "web + 2 workers + clock")):
    xs = took[typed]
    print(f"{name:24} deploy start -> promoted: median {pct(xs, 50):.1f} ms, p90 {pct(xs, 90):.1f} ms (n={len(xs)})")
print(f"median difference: {pct(took[True], 50) - pct(took[False], 50):+.1f} ms "
      "(of which 400 ms are the two min_ready_ms holds: the workers', then the clock's)")
