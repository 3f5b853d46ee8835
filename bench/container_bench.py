#!/usr/bin/env python3
"""What a container costs a release (issue 60), side by side in one run:

1. time from `candidate_started` to the switch (`current`'s promoted_at, no watch) for the same
   service (rollgate's sample-service) as a process release and as a container release from a
   `docker save` archive, deploys interleaved so the machine's load falls on both alike;
2. the proxy's throughput (wrk, 2 threads, 32 connections) in front of each, interleaved rounds.

The container release is installed once with `release add … docker-archive:ARCHIVE`; each further
version is a copy of its folder (the same image: only the start is measured, not the load).

Usage: DOCKER_HOST=unix:///… python3 bench/container_bench.py ROLLGATE ARCHIVE RUNS [SECONDS]
"""
import json, os, re, shutil, subprocess, sys, tempfile, time

from benchlib import free_port, pct, sample_release, started_to_switch

rollgate, archive, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
seconds = int(sys.argv[4]) if len(sys.argv) > 4 else 5


def policy(root):
    path = os.path.join(root, "policy.json")
    with open(path, "w") as f:
        json.dump({"edge_svc": {"progress_deadline_ms": 30000, "poll_ms": 50, "max_unavailable_pct": 0,
                                "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
                                "keep_releases": 0, "stop_grace_ms": 2000}}, f)
    return path


def deploy(root, version, pol):
    out = subprocess.run([rollgate, "deploy", "edge-svc", str(free_port()), version, "--root", root,
                          "--policy", pol], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return started_to_switch(root)


def wrk(port):
    out = subprocess.run(["wrk", "-t2", "-c32", f"-d{seconds}s", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: .*", out)
    return rps, int(bad.group(1)) if bad else 0, errors.group(0) if errors else ""


def stop(root):
    subprocess.run(["sh", "-c", f". '{os.path.dirname(os.path.abspath(__file__))}/lib.sh'; stop_releases '{root}'"])


took = {"process": [], "container": []}
throughput = {"process": [], "container": []}
with tempfile.TemporaryDirectory() as base:
    roots = {kind: os.path.join(base, kind) for kind in took}
    for root in roots.values():
        os.makedirs(root)
    os.chmod(base, 0o755)
    out = subprocess.run([rollgate, "release", "add", "edge-svc", "c0", f"docker-archive:{archive}",
                          "--root", roots["container"]], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    pols = {kind: policy(root) for kind, root in roots.items()}
    for i in range(runs):
        for kind in (("process", "container") if i % 2 == 0 else ("container", "process")):
            root, v = roots[kind], f"v{i}"
            if kind == "process":
                sample_release(root, v, rollgate)
            else:
                shutil.copytree(os.path.join(root, "releases", "c0"), os.path.join(root, "releases", v))
            took[kind].append(deploy(root, v, pols[kind]))
    proxies = {}
    for kind, root in roots.items():
        port = free_port()
        proxies[kind] = (subprocess.Popen([rollgate, "proxy", "--listen", f"127.0.0.1:{port}", "--root", root],
                                          stderr=subprocess.DEVNULL), port)
    time.sleep(1)
    for round_ in range(3):
        for kind in (("process", "container") if round_ % 2 == 0 else ("container", "process")):
            throughput[kind].append(wrk(proxies[kind][1]))
    for proxy, _ in proxies.values():
        proxy.terminate(); proxy.wait()
    for root in roots.values():
        stop(root)
    time.sleep(3)

for kind in took:
    xs = took[kind]
    print(f"{kind:9} start -> switch: median {pct(xs, 50):.1f} ms, p90 {pct(xs, 90):.1f} ms (n={len(xs)})")
print(f"median difference (container - process): {pct(took['container'], 50) - pct(took['process'], 50):+.1f} ms")
for kind in throughput:
    rounds = throughput[kind]
    print(f"{kind:9} through the proxy: " + ", ".join(f"{rps:.0f} req/s (non-2xx {bad}{'; ' + err if err else ''})" for rps, bad, err in rounds))
