#!/usr/bin/env python3
"""kill -9 rollgate at random moments of rollouts and of the commands that steer them, finish
with the command a person would run next, and count what a crash must never leave.

Usage: bench/rollout_crash.py ROLLGATE [KILLS] [SEED] [REPLICAS]

Six replicas (by default) of a sample service behind `rollgate proxy`, under a steady load of
GET requests. Each round rolls every replica to the other of two versions (waves 1, 10, 50,
100 %, 300 ms soak) in one of four ways, picked at random:

- rollout: the rollout's rollgate gets SIGKILL after a random delay (0-2.5 s), then
  `rollout resume`;
- fault: the rollout runs with ROLLGATE_FAULT=kill-after-action:K (K random in 1-60), so it
  dies right after a persisted action, then `rollout resume`;
- pause: `rollout pause` is asked mid-rollout and itself killed after a random delay, then
  `rollout resume` is killed the same way, then `rollout resume` runs to the end;
- abort: `rollout abort --rollback` is asked mid-rollout and killed after a random delay, then
  asked again: the round ends aborted on the previous version (or completed, when the abort
  lost the race with the rollout's end).

A reference rollout with no kill runs first. Throughout, a sampler reads the pool every 20 ms.
It counts:

- wrong ends: a round that does not end as its kind says (above);
- empty pools: a sample of the pool with no replica that answers (while one ran before);
- budget breaks: a sample with fewer ready replicas in the pool than N - unavailable, or more
  replica processes than N + surge (an abort's restores count within the surge);
- orphans: after a round, a replica process running from the root that the pool does not name;
- duplicate outcomes: a rollout id with more than one `promoted`/`rolled_back` line;
- missing outcomes: a rollout that ended (completed or aborted) with no outcome line;
- failed requests through the proxy.

Exit status 0 only when all are zero. KINDS=pause,abort (say) draws from those kinds only;
TRACE_EXITS=1 runs each replica under a shell that records how it ended in ROOT/exits. A copy
of the root is kept at each wrong end, and every command's stderr goes to ROOT-stderr.log.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from benchlib import free_port, port_free, stop_keepers


def replica_processes(root):
    """Live processes started by a rollout under root (they carry ROLLGATE_SLOT)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if not os.readlink(f"/proc/{name}/cwd").startswith(root):
                continue
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if state not in ("Z", "X") and any(v.startswith(b"ROLLGATE_SLOT=") for v in env):
            found.append(int(name))
    return found


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def pool(root):
    try:
        with open(os.path.join(root, "replicas.json")) as f:
            return json.load(f)["replicas"]
    except (OSError, ValueError):
        return None


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=0.5) as r:
            return r.status == 200
    except Exception:
        return False


class Sampler(threading.Thread):
    def __init__(self, root):
        super().__init__(daemon=True)
        self.root, self.stop = root, False
        self.fewest_ready, self.most_processes, self.samples = 10**9, 0, 0
        self.empty = 0

    def run(self):
        while not self.stop:
            before = pool(self.root)
            n = sum(ready(r["port"]) for r in before) if before is not None else None
            after = pool(self.root)
            # A pool that changed while it was probed is sampled again.
            if n is not None and before == after:
                self.fewest_ready = min(self.fewest_ready, n)
                self.empty += int(n == 0)
                self.samples += 1
            self.most_processes = max(self.most_processes, len(replica_processes(self.root)))
            time.sleep(0.02)


class Load(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.stop, self.served, self.failed = port, False, 0, []

    def run(self):
        while not self.stop:
            why = None
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=10) as r:
                    if r.status != 200:
                        why = f"HTTP {r.status}"
            except Exception as e:
                why = repr(e)
            self.served += 1
            if why is not None:
                self.failed.append(why)
            time.sleep(0.003)


def main():
    rollgate = os.path.abspath(sys.argv[1])
    kills = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 12)
    replicas = int(sys.argv[4]) if len(sys.argv) > 4 else 6
    surge = -(-replicas * 25 // 100)
    root = tempfile.mkdtemp(prefix="rollgate-rollout-crash-")
    for version in ("a", "b"):
        d = os.path.join(root, "releases", version)
        os.makedirs(d)
        path = os.path.join(d, "edge-svc")
        with open(path, "w") as f:
            if os.environ.get("TRACE_EXITS"):
                # The replica runs under a shell that records how it ended (and any SIGTERM the
                # group got) in ROOT/exits, to tell rollgate's stops from anything else.
                f.write("#!/bin/sh\n"
                        f"trap 'echo \"$$ slot=$ROLLGATE_SLOT got TERM\" >> {root}/exits' TERM\n"
                        f"'{rollgate}' sample-service --ready-after-ms 100\n"
                        f"echo \"$$ slot=$ROLLGATE_SLOT exited $? at $(date +%s.%N)\" >> {root}/exits\n")
            else:
                f.write(f"#!/bin/sh\nexec '{rollgate}' sample-service --ready-after-ms 100\n")
        os.chmod(path, 0o755)
    first = free_port()
    while any(not port_free(p) for p in range(first, first + replicas + surge + 4)):
        first = free_port()
    ports = f"{first}-{first + replicas + surge + 3}"

    # Every rollgate command's stderr, in order, beside the root (recovery says there which
    # processes it stops).
    said = open(f"{root}-stderr.log", "a")

    def run(*args, check=None):
        out = subprocess.run([rollgate, *args, "--root", root], capture_output=True, text=True)
        said.write(f"== {' '.join(args)}\n{out.stderr}")
        said.flush()
        if check is not None and out.returncode != check:
            sys.exit(f"{args}: exit {out.returncode}: {out.stdout}{out.stderr}")
        return out

    run("rollout", "edge-svc", "a", "--replicas", str(replicas), "--ports", ports,
        "--deadline-ms", "20000", check=0)
    proxy_port = free_port()
    proxy = subprocess.Popen([rollgate, "proxy", "--listen", f"127.0.0.1:{proxy_port}",
                              "--root", root], stderr=subprocess.DEVNULL)
    while not port_open(proxy_port):
        time.sleep(0.01)
    load, sampler = Load(proxy_port), Sampler(root)
    load.start()
    sampler.start()

    args = ["--waves", "1,10,50,100", "--soak", "300ms"]
    started = time.time()
    run("rollout", "edge-svc", "b", *args, check=0)
    reference = time.time() - started
    wrong_ends, orphans = 0, 0
    kinds = {"rollout": 0, "fault": 0, "pause": 0, "abort": 0}
    killed_mid = 0

    def killed_after(command, delay, env=None):
        """Runs a rollgate command in the background, SIGKILLs it after `delay` s if it
        still runs; True when it was killed."""
        nonlocal killed_mid
        said.write(f"== {' '.join(command)}\n")
        said.flush()
        child = subprocess.Popen([rollgate, *command, "--root", root], env=env,
                                 stdout=subprocess.DEVNULL, stderr=said)
        if delay is not None:
            try:
                child.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGKILL)
        child.wait()
        if child.returncode == -signal.SIGKILL:
            killed_mid += 1
            return True
        return False

    def state():
        with open(os.path.join(root, "rollout.json")) as f:
            return json.load(f)

    current = "b"
    for _ in range(kills):
        target = "a" if current == "b" else "b"
        kind = rng.choice(os.environ.get("KINDS", ",".join(kinds)).split(","))
        kinds[kind] += 1
        start = ["rollout", "edge-svc", target, *args]
        before = state()["id"]
        if kind == "fault":
            env = dict(os.environ, ROLLGATE_FAULT=f"kill-after-action:{rng.randint(1, 60)}")
            killed_after(start, None, env)
        elif kind == "rollout":
            killed_after(start, rng.uniform(0, 2.5))
        else:
            child = subprocess.Popen([rollgate, *start, "--root", root],
                                     stdout=subprocess.DEVNULL, stderr=said)
            time.sleep(rng.uniform(0, 1.5))
            if kind == "pause":
                killed_after(["rollout", "pause", "edge-svc"], rng.uniform(0, 0.5))
                killed_after(["rollout", "resume", "edge-svc"], rng.uniform(0, 1.0))
            else:
                killed_after(["rollout", "abort", "edge-svc", "--rollback"], rng.uniform(0, 1.0))
            # The rollout's own rollgate ends (paused, aborted) or is killed by the round.
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGKILL)
                child.wait()
        if state()["id"] == before:
            # Killed before the plan was saved: nothing started; a person runs it again. (The
            # id tells, not the target: the last round may have been an abort to this target.)
            run(*start)
        if kind == "abort":
            out = run("rollout", "abort", "edge-svc", "--rollback")
        else:
            out = run("rollout", "resume", "edge-svc")
        if os.environ.get("VERBOSE"):
            print(f"{kind} to {target}: {out.stdout.strip()[:100]} {out.stderr.strip()[:100]}")
        if out.returncode not in (0, 2):
            print(f"{kind} to {target}: exit {out.returncode}: {out.stdout}{out.stderr}")
        ended = state()
        now = [r["version"] for r in pool(root) or []]
        if kind == "abort" and ended["phase"] == "aborted":
            expected = ("aborted", [current] * replicas)
        else:
            expected = ("completed", [target] * replicas)
        if (ended["phase"], now) != expected or ended["to"] != target:
            wrong_ends += 1
            print(f"wrong end of a {kind} to {target}: {ended['phase']} {now}")
            kept = shutil.copytree(root, f"{root}-wrong-end-{wrong_ends}",
                                   ignore=shutil.ignore_patterns("*.sock"))
            print(f"  root kept in {kept}; commands' stderr in {root}-stderr.log")
        current = now[0] if now and len(set(now)) == 1 else target
        named = {r["pid"] for r in pool(root) or []}
        # A replica's own workers (under TRACE_EXITS, the service under its shell) are its.
        stray = [p for p in replica_processes(root) if p not in named and parent(p) not in named]
        if stray:
            orphans += len(stray)
            print(f"orphans after a {kind} to {target}: {stray}")

    sampler.stop = load.stop = True
    sampler.join()
    load.join()
    outcomes = {}
    with open(os.path.join(root, "deploy.log")) as f:
        for line in f:
            record = json.loads(line)
            if record["event"] in ("promoted", "rolled_back"):
                outcomes[record.get("token")] = outcomes.get(record.get("token"), 0) + 1
    duplicates = sum(1 for n in outcomes.values() if n > 1)
    # Every rollout that started and ended has its outcome line (the last may still be the
    # state file's; all rounds end completed or aborted).
    with open(os.path.join(root, "deploy.log")) as f:
        started_ids = [json.loads(line).get("token") for line in f
                       if '"rollout_started"' in line]
    missing = sum(1 for i in started_ids if outcomes.get(i, 0) == 0)
    budget_breaks = int(sampler.fewest_ready < replicas) + \
        int(sampler.most_processes > replicas + surge)
    proxy.send_signal(signal.SIGTERM)
    proxy.wait()
    stop_keepers(root)
    for r in pool(root) or []:
        try:
            os.killpg(r["pid"], signal.SIGKILL)
        except OSError:
            pass
    print(f"{kills} rounds ({', '.join(f'{k} {n}' for k, n in kinds.items())}), "
          f"{killed_mid} rollgate processes killed mid-command, {replicas} replicas, "
          f"surge {surge}; uninterrupted rollout {reference:.2f} s")
    print(f"wrong ends {wrong_ends}, empty pools {sampler.empty}, budget breaks "
          f"{budget_breaks} (fewest ready {sampler.fewest_ready}/{replicas}, most processes "
          f"{sampler.most_processes}/{replicas + surge}, {sampler.samples} samples), orphans "
          f"{orphans}, duplicate outcomes {duplicates}, missing outcomes {missing} of "
          f"{len(started_ids)} rollouts, requests {load.served}, failed {len(load.failed)}")
    if load.failed:
        print("failures, e.g.:", load.failed[:3])
    shutil.rmtree(root, ignore_errors=True)
    bad = wrong_ends + sampler.empty + budget_breaks + orphans + duplicates + missing + \
        len(load.failed)
    sys.exit(0 if bad == 0 else 1)


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    main()
