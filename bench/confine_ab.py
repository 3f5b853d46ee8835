#!/usr/bin/env python3
"""Two rollgate binaries side by side (issue 78: the release tree read beneath its folder, the
output in ROOT/output, a cgroup group per release): the same confined deploy of a release with a
Procfile (web and one worker) and an env file, interleaved A, B, B, A ... in one run so the
machine's load falls on both alike. Each deploy is timed whole (the command's wall time, which
holds every read of the release, the group's cgroup folders and the gate) and from
`candidate_started` to the switch. Prints the median and p90 of each, and B's median against A's.

Usage: python3 bench/confine_ab.py ROLLGATE_A ROLLGATE_B RUNS
Both binaries must be where a service's own uid can run them (as the tests' copy in
/tmp/rollgate-it-bin is), since each release runs its binary's sample service.
"""
import json, os, subprocess, sys, tempfile, time

from benchlib import port_block, pct, started_to_switch

binaries, runs = {"A": sys.argv[1], "B": sys.argv[2]}, int(sys.argv[3])


def release(root, version, rollgate):
    """A folder release installed with `release add`: the sample service as web, a worker, an
    env file."""
    with tempfile.TemporaryDirectory() as build:
        with open(os.path.join(build, "edge-svc"), "w") as f:
            f.write(f"#!/bin/sh\nexec '{rollgate}' sample-service\n")
        os.chmod(os.path.join(build, "edge-svc"), 0o755)
        with open(os.path.join(build, "Procfile"), "w") as f:
            f.write("worker: exec sleep 600\n")
        with open(os.path.join(build, "env"), "w") as f:
            f.write("GREETING=hello\n")
        out = subprocess.run([rollgate, "release", "add", "edge-svc", version, build, "--root", root],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def policy(root):
    path = os.path.join(root, "policy.json")
    with open(path, "w") as f:
        json.dump({"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 50, "max_unavailable_pct": 0,
                                "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
                                "keep_releases": 0, "isolation": {"memory_mb": 256, "pids": 64},
                                "processes": {"worker": {"min_ready_ms": 100}}}}, f)
    return path


whole = {"A": [], "B": []}
switch = {"A": [], "B": []}
roots = {name: tempfile.mkdtemp(prefix=f"confine-ab-{name}-") for name in binaries}
try:
    for name, root in roots.items():
        os.chmod(root, 0o755)
    ports = {name: port_block(2) for name in binaries}
    policies = {name: policy(root) for name, root in roots.items()}
    for i in range(runs):
        for name in (("A", "B") if i % 2 == 0 else ("B", "A")):
            rollgate, root = binaries[name], roots[name]
            version = f"v{i}"
            release(root, version, rollgate)
            began = time.monotonic()
            out = subprocess.run([rollgate, "deploy", "edge-svc", version, "--ports", ports[name],
                                  "--root", root, "--policy", policies[name]],
                                 capture_output=True, text=True)
            whole[name].append((time.monotonic() - began) * 1000)
            assert out.returncode == 0, out.stderr
            switch[name].append(started_to_switch(root))
finally:
    here = os.path.dirname(os.path.abspath(__file__))
    for name, root in roots.items():
        # `stop` ends the worker and the keepers too; stop_releases whatever is left.
        subprocess.run([binaries[name], "stop", "edge-svc", "--root", root], capture_output=True)
        subprocess.run(["sh", "-c", f". '{here}/lib.sh'; stop_releases '{root}'"])

for name in binaries:
    print(f"{name} ({binaries[name]}): deploy {pct(whole[name], 50):.1f} ms median, "
          f"p90 {pct(whole[name], 90):.1f}; start -> switch {pct(switch[name], 50):.1f} ms median "
          f"(n={len(whole[name])})")
ratio = pct(whole["B"], 50) / pct(whole["A"], 50)
print(f"B's median deploy against A's: {ratio * 100 - 100:+.1f} %")
