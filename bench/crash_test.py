#!/usr/bin/env python3
"""kill -9 the deployer at random moments and check what the next deploy finds.

Usage: bench/crash_test.py ROLLGATE [ROUNDS] [SEED]

Each round starts a deploy (a good release, a slow one, one that crashes at boot, or one that
crashes at boot leaving a worker in its process group), sends it
SIGKILL after a random delay (0-600 ms: before the spawn, during the gate, in the switch, between
the log line and clearing the record), then runs one more deploy to completion, which must
recover whatever was left. It counts:

- torn pointers: `current` that is not one whole JSON pointer, read right after each kill;
- duplicate outcomes: a deploy token with more than one `promoted`/`rolled_back` line;
- lost outcomes: a token with `candidate_started` and no outcome once the next deploy is done;
- orphans: after each completed deploy, a process running from the root that is not the live
  release's process group;
- wrong live release: `current` naming a process that is not running.

Exit status 0 only when all five are zero.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchlib import free_port, stop_keepers


def stat_fields(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def running_from(root):
    """Live processes whose working directory is inside root: (pid, pgid)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if not os.readlink(f"/proc/{name}/cwd").startswith(root):
                continue
            fields = stat_fields(name)
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            found.append((int(name), int(fields[2])))
    return found


def read_pointer(root):
    try:
        with open(os.path.join(root, "current"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, True
    try:
        pointer = json.loads(data)
        whole = all(k in pointer for k in ("version", "port", "pid", "start_time"))
        return pointer, whole
    except ValueError:
        return None, False


def main():
    rollgate = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 11)
    root = os.path.realpath(tempfile.mkdtemp(prefix="rollgate-crash-"))
    kinds = {
        "good": f"exec '{rollgate}' sample-service --ready-after-ms 50\n",
        "slow": f"exec '{rollgate}' sample-service --ready-after-ms 300\n",
        "crash": "echo boom\nexit 78\n",
        # Exits at boot and leaves a worker in its process group.
        "leaky": "sleep 1000 &\nexit 78\n",
    }
    for kind, body in kinds.items():
        path = os.path.join(root, "releases", kind, "edge-svc")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)

    def deploy(kind):
        return subprocess.Popen(
            [rollgate, "deploy", "edge-svc", str(free_port()), kind, "1000",
             "--root", root, "--grace-ms", "500"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    counts = dict(torn=0, dead_live=0, refused=0)
    orphans = set()
    first = deploy("good")
    first.wait()
    started = time.time()
    for i in range(rounds):
        kind = rng.choice(["good", "good", "slow", "crash", "leaky"])
        victim = deploy(kind)
        time.sleep(rng.uniform(0, 0.6))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        pointer, whole = read_pointer(root)
        counts["torn"] += not whole
        survivor = deploy("good")
        _, err = survivor.communicate()
        if survivor.returncode not in (0, 1):
            counts["refused"] += 1
            print(f"round {i}: next deploy exited {survivor.returncode}: {err.decode().strip()}")
        pointer, whole = read_pointer(root)
        counts["torn"] += not whole
        live_group = pointer["pid"] if pointer else None
        if pointer and not os.path.exists(f"/proc/{pointer['pid']}"):
            counts["dead_live"] += 1
        stray = [pid for pid, pgid in running_from(root) if pgid != live_group]
        if set(stray) - orphans:
            # Give a stopping group a moment; anything still there is an orphan.
            time.sleep(1.0)
            stray = [pid for pid, pgid in running_from(root) if pgid != live_group]
        fresh = set(stray) - orphans
        if fresh:
            print(f"round {i}: new orphans {sorted(fresh)}")
        orphans |= fresh
    elapsed = time.time() - started

    outcomes, started_tokens = {}, set()
    with open(os.path.join(root, "deploy.log")) as f:
        for line in f:
            record = json.loads(line)
            # Logs written before deploy tokens existed: the candidate's pid names the attempt.
            token = record.get("token") or f"pid {record.get('pid')}"
            if record["event"] == "candidate_started":
                started_tokens.add(token)
            if record["event"] in ("promoted", "rolled_back"):
                outcomes[token] = outcomes.get(token, 0) + 1
    duplicates = sum(1 for n in outcomes.values() if n > 1)
    lost = sum(1 for t in started_tokens if t not in outcomes)
    print(json.dumps(dict(
        rounds=rounds, seconds=round(elapsed, 1), attempts=len(started_tokens),
        torn_pointers=counts["torn"], duplicate_outcomes=duplicates, lost_outcomes=lost,
        orphans=len(orphans), dead_live_release=counts["dead_live"],
        next_deploy_refused=counts["refused"],
        promoted=sum(1 for line in open(os.path.join(root, "deploy.log")) if '"promoted"' in line),
    )))
    stop_keepers(root)
    for pid, _ in running_from(root):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)
    bad = counts["torn"] + duplicates + lost + len(orphans) + counts["dead_live"]
    sys.exit(1 if bad or counts["refused"] else 0)


if __name__ == "__main__":
    main()
