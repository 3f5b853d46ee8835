#!/usr/bin/env python3
"""What keeping a release costs (issue 68): a keeper's memory and idle CPU, and how fast a
release killed with SIGKILL answers again, against a shell loop that restarts the same
program (`while :; do svc; done`, what a bare shell user writes; systemd is not PID 1 on this
machine, so `Restart=always` cannot run here).

    python3 bench/keeper_bench.py ROLLGATE [SERVICES] [KILLS]

Deploys SERVICES roots (one release each, no `up`), reads each keeper's RSS and PSS
(/proc/PID/smaps_rollup) and its CPU over 20 idle seconds, then kills each release once
and times each kill -> first 200 on /readyz (each service's release once: a first exit is
restarted at once, later ones back off); the shell loop is killed KILLS times. Prints one JSON
object."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchlib import free_port, pct, sample_release, stop_keepers


def answers(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


def kb(pid, field):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def time_restarts(kill, port, rounds):
    """Milliseconds from each kill to the first 200 on /readyz."""
    took = []
    for _ in range(rounds):
        kill()
        began = time.monotonic()
        # The old process may answer a moment after the signal: wait until it stops first.
        while answers(port) and time.monotonic() - began < 1:
            time.sleep(0.001)
        while not answers(port):
            if time.monotonic() - began > 30:
                raise SystemExit("not answering again after 30 s")
            time.sleep(0.002)
        took.append((time.monotonic() - began) * 1000)
        time.sleep(0.3)
    return took


def main():
    rollgate = os.path.abspath(sys.argv[1])
    services = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    kills = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    work = tempfile.mkdtemp(prefix="keeper-bench-")
    # The services (their own uids) must be able to enter it.
    os.chmod(work, 0o755)
    roots = []
    try:
        for i in range(services):
            root = os.path.join(work, f"s{i}")
            os.makedirs(root)
            sample_release(root, "v1", rollgate)
            out = subprocess.run([rollgate, "deploy", "edge-svc", str(free_port()), "v1",
                                  "--watch-ms", "0", "--root", root], capture_output=True)
            assert out.returncode == 0, out.stderr
            roots.append(root)
        keepers = [int(n) for r in roots for n in os.listdir(os.path.join(r, ".keepers"))]
        rss = [kb(p, "Rss") for p in keepers]
        pss = [kb(p, "Pss") for p in keepers]
        before = sum(ticks(p) for p in keepers)
        time.sleep(20)
        idle_ticks = sum(ticks(p) for p in keepers) - before
        hz = os.sysconf("SC_CLK_TCK")

        # Each service's release killed once: a first exit is started again at once (a
        # second within 30 s waits out the backoff, 1 s doubling, by design).
        kept = []
        for root in roots:
            with open(os.path.join(root, "current")) as f:
                live = json.load(f)
            kept += time_restarts(lambda: os.kill(live["pid"], signal.SIGKILL), live["port"], 1)

        # The shell loop, on the same program.
        loop_port = free_port()
        env = dict(os.environ, PORT=str(loop_port), ROLLGATE_VERSION="v1")
        loop = subprocess.Popen(["sh", "-c", f"while :; do {rollgate} sample-service; done"],
                                env=env, start_new_session=True)
        while not answers(loop_port):
            time.sleep(0.01)

        def kill_loops_child():
            with open(f"/proc/{loop.pid}/task/{loop.pid}/children") as f:
                os.kill(int(f.read().split()[0]), signal.SIGKILL)

        looped = time_restarts(kill_loops_child, loop_port, kills)
        loop_rss = kb(loop.pid, "Rss")
        os.killpg(loop.pid, signal.SIGKILL)
        print(json.dumps(dict(
            keepers=len(keepers),
            keeper_rss_kib=statistics.median(rss), keeper_pss_kib=statistics.median(pss),
            keepers_idle_cpu_ms_per_s=round(idle_ticks * 1000 / hz / 20, 3),
            restart_ms=dict(p50=round(pct(kept, 50), 1), p95=round(pct(kept, 95), 1)),
            shell_loop_restart_ms=dict(p50=round(pct(looped, 50), 1),
                                       p95=round(pct(looped, 95), 1)),
            shell_loop_rss_kib=loop_rss,
        )))
    finally:
        for root in roots:
            stop_keepers(root)
            try:
                with open(os.path.join(root, "current")) as f:
                    os.killpg(json.load(f)["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
