#!/usr/bin/env python3
"""`rollgate scale` of a release with web, two workers and a singleton clock (issue 80, 4):
the wall time of `scale edge-svc worker=+1` from its start to its exit (the new worker ready:
held `min_ready_ms` = 200), then back with `worker=-1`, for two builds side by side in one run
(interleaved, each on a root of its own), and how many of the release's processes each left
running as they were (web's pid, the clock's, the first worker's). A build whose `scale` has no
relative counts (the one before issue 80, 4) is asked `worker=3` / `worker=2` with a port range,
which is what its users had to give.

Usage: python3 bench/scale_bench.py NEW OLD RUNS
"""
import json, os, subprocess, sys, tempfile, time

from benchlib import pct, port_block, sample_release

new, old, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
LOOP = "trap 'exit 0' TERM\nwhile :; do sleep 1; done\n"
POLICY = {"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 50, "max_unavailable_pct": 0,
                       "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
                       "processes": {"worker": {"replicas": 2, "min_ready_ms": 200},
                                     "clock": {"singleton": True, "min_ready_ms": 200}}}}


def setup(rollgate, root, ports):
    sample_release(root, "v1", rollgate)
    folder = os.path.join(root, "releases", "v1")
    with open(os.path.join(folder, "Procfile"), "w") as f:
        f.write("worker: exec sh loop.sh\nclock: exec sh loop.sh\n")
    with open(os.path.join(folder, "loop.sh"), "w") as f:
        f.write(LOOP)
    policy = os.path.join(root, "policy.json")
    with open(policy, "w") as f:
        json.dump(POLICY, f)
    out = subprocess.run([rollgate, "deploy", "edge-svc", "v1", "--ports", ports, "--root", root,
                          "--policy", policy], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return policy


def pids(root):
    with open(os.path.join(root, "current")) as f:
        web = json.load(f)["pid"]
    # formation.json (every type; web's too), or processes.json for a build from before it.
    path = os.path.join(root, "formation.json")
    if not os.path.exists(path):
        path = os.path.join(root, "processes.json")
    with open(path) as f:
        typed = {
            f"{p['process_type']}.{p['index']}": p["pid"]
            for p in json.load(f)["processes"]
            if p["process_type"] != "web"
        }
    return web, typed


builds = {"new": new, "old": old}
took = {name: {"up": [], "down": []} for name in builds}
kept = {name: 0 for name in builds}
asks = {"new": (["worker=+1"], ["worker=-1"]), "old": (["worker=3"], ["worker=2"])}
with tempfile.TemporaryDirectory() as new_root, tempfile.TemporaryDirectory() as old_root:
    roots = {"new": new_root, "old": old_root}
    ports = {name: port_block(4) for name in builds}
    policies = {name: setup(builds[name], roots[name], ports[name]) for name in builds}
    for i in range(runs):
        for name in (("new", "old") if i % 2 == 0 else ("old", "new")):
            rollgate, root = builds[name], roots[name]
            for way, asked in zip(("up", "down"), asks[name]):
                web, typed = pids(root)
                extra = ["--ports", ports[name]] if name == "old" else []
                began = time.monotonic()
                out = subprocess.run([rollgate, "scale", "edge-svc", *asked, "--root", root,
                                      "--policy", policies[name], *extra],
                                     capture_output=True, text=True)
                took[name][way].append((time.monotonic() - began) * 1000)
                assert out.returncode == 0, out.stderr
                web_after, typed_after = pids(root)
                kept[name] += (web == web_after) + sum(
                    typed.get(p) == typed_after.get(p) for p in ("worker.0", "worker.1", "clock.0"))
    here = os.path.dirname(os.path.abspath(__file__))
    for name, root in roots.items():
        subprocess.run([builds[name], "stop", "edge-svc", "--root", root], capture_output=True)
        subprocess.run(["sh", "-c", f". '{here}/lib.sh'; stop_releases '{root}'"])

for name in builds:
    up, down = took[name]["up"], took[name]["down"]
    print(f"{name}: one more worker: median {pct(up, 50):.1f} ms, p90 {pct(up, 90):.1f} ms; "
          f"one fewer: median {pct(down, 50):.1f} ms, p90 {pct(down, 90):.1f} ms (n={len(up)}); "
          f"processes kept as they were: {kept[name]} of {8 * runs} (web, worker.0, worker.1, clock.0 per scale)")
