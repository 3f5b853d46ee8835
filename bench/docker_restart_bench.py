#!/usr/bin/env python3
"""Keeping a container release running (issue 68) against Docker's own restart policy, side by
side in one run on one engine, for the same image (rollgate's sample-service in a `docker save`
archive, as the container tests build it):

- rollgate: SERVICES roots, each with the image as a release deployed in a bare shell (no `up`);
  its keeper starts `container-run` again when the container dies;
- Docker: SERVICES containers of the same image, `docker run -d --restart always
  --network host` (the engine's restart manager starts them again).

Each container's main process is killed with SIGKILL once (a first exit: both restart at once,
later ones back off by design), and the time to the first 200 on /readyz is taken; kills
alternate between the two. Also read: the resident memory (PSS) of what each adds beside the
containerd shim both have — the keeper and `container-run` for rollgate, nothing per container
for Docker (dockerd is shared) — and their CPU over 20 idle seconds.

    DOCKER_HOST=unix:///… python3 bench/docker_restart_bench.py ROLLGATE ARCHIVE [SERVICES]

Prints one JSON object."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchlib import free_port, pct
from keeper_bench import answers, kb, ticks, time_restarts


def docker(*args):
    out = subprocess.run(["docker", *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def main_pid(container):
    return int(docker("inspect", "-f", "{{.State.Pid}}", container))


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def main():
    rollgate, archive = os.path.abspath(sys.argv[1]), sys.argv[2]
    services = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    work = tempfile.mkdtemp(prefix="docker-restart-bench-")
    os.chmod(work, 0o755)
    roots, containers = [], []
    try:
        image = docker("load", "-q", "-i", archive).split()[-1]
        for i in range(services):
            root = os.path.join(work, f"s{i}")
            os.makedirs(root)
            out = subprocess.run([rollgate, "release", "add", "edge-svc", "v1",
                                  f"docker-archive:{archive}", "--root", root],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            out = subprocess.run([rollgate, "deploy", "edge-svc", str(free_port()), "v1",
                                  "--watch-ms", "0", "--root", root], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            roots.append(root)
            port = free_port()
            name = f"restart-bench-{os.getpid()}-{i}"
            docker("run", "-d", "--name", name, "--restart", "always", "--network", "host",
                   "-e", f"PORT={port}", "-e", "ROLLGATE_VERSION=v1", image)
            containers.append((name, port))
        for _, port in containers:
            while not answers(port):
                time.sleep(0.01)
        keepers = [int(n) for r in roots for n in os.listdir(os.path.join(r, ".keepers"))]
        runners = [c for k in keepers for c in children(k)]
        added = keepers + runners
        pss = [kb(p, "Pss") for p in added]
        before = sum(ticks(p) for p in added)
        time.sleep(20)
        idle_ticks = sum(ticks(p) for p in added) - before
        hz = os.sysconf("SC_CLK_TCK")
        # Docker resets its backoff for a container that ran 10 s: all have by now.

        kept, restarted = [], []
        for root, (name, port) in zip(roots, containers):
            with open(os.path.join(root, "current")) as f:
                live = json.load(f)
            container = docker("ps", "-q", "--filter", f"label=dev.rollgate.root={root}")
            pid = main_pid(container.split()[0])
            kept += time_restarts(lambda: os.kill(pid, signal.SIGKILL), live["port"], 1)
            theirs = main_pid(name)
            restarted += time_restarts(lambda: os.kill(theirs, signal.SIGKILL), port, 1)
        print(json.dumps(dict(
            services=services,
            rollgate_restart_ms=dict(p50=round(pct(kept, 50), 1), max=round(max(kept), 1)),
            docker_restart_always_ms=dict(p50=round(pct(restarted, 50), 1),
                                          max=round(max(restarted), 1)),
            rollgate_added_pss_kib_per_container=round(sum(pss) / services),
            rollgate_added_idle_cpu_ms_per_s=round(idle_ticks * 1000 / hz / 20, 3),
        )))
    finally:
        for name, _ in containers:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        for root in roots:
            subprocess.run(["sh", "-c", f". '{os.path.dirname(os.path.abspath(__file__))}/lib.sh'; stop_releases '{root}'"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
