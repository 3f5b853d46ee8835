#!/usr/bin/env python3
"""Deploys under load on one address, three ways, interleaved (issue 39).

Usage: bench/listen_bench.py ROLLGATE [DEPLOYS] [SEED] [KILLS]

Each of three setups serves one address on 127.0.0.1 and takes DEPLOYS deploys (default 100),
every fifth one bad, the bad kinds in turn: exits at boot, never ready, ready then crashes in
the watch (0.7 s after start, the watch lasting 1.5 s):

- listen: rollgate holds the socket (policy `listen`) and hands it to each release
  (`sample-service --listen-fds`); `rollgate deploy` gates the candidate on its PORT.
- proxy: the releases bind their own PORT; `rollgate proxy` on the address; `rollgate deploy
  --ports A-B` switches what it routes to.
- restart: a systemd-style restart on one socket (`RestartMode=direct`-like, no gate): this
  script holds the socket, and each deploy stops the running release (SIGTERM, waits for it)
  then starts the new one with the socket as fd 3. A bad release is simply what runs next.

The setups take their deploys in turns of ten (listen, proxy, restart, listen, ...), each turn
under a steady load on its own address: a request on a new connection every 2 ms from one
client, with a 5 s timeout. For each setup it reports requests, refused connections, other
failed requests, p50/p99/max latency, and the worst 100 ms window's p99 (the spike).

KILLS > 0 adds a fourth setup, `listen-kill`: the same deploys on a held socket, each deploy's
rollgate killed with SIGKILL after a random 0-2 s (KILLS of them), then the deploy run again
(recovery); it counts refused connections while a good release was live (must be 0) and, at
the end, processes under its root that no state names (orphans; must be 0).

Exit status 0 only when the listen setups refused and failed nothing a good release owed.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import free_port, stop_keepers

BAD = ["boot", "never", "crash"]


def percentile(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


class Load(threading.Thread):
    """One client: a GET on a new connection every 2 ms; latencies and failures, timed."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.stop = port, False
        self.samples = []  # (start, latency or None, why)

    def one(self):
        start = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                answer = b""
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            if not answer.startswith(b"HTTP/1.1 200"):
                return start, None, f"answer {answer[:40]!r}"
            return start, time.monotonic() - start, None
        except ConnectionRefusedError:
            return start, None, "refused"
        except Exception as e:
            return start, None, type(e).__name__

    def run(self):
        while not self.stop:
            self.samples.append(self.one())
            time.sleep(0.002)


def sample_args(kind, listen_fds):
    fds = "--listen-fds " if listen_fds else ""
    return {
        "good": fds,
        "boot": fds + "--exit-after-ms 0",
        "never": fds + "--ready-after-ms 600000",
        "crash": fds + "--exit-after-ms 700",
    }[kind]


class Setup:
    def __init__(self, name, rollgate, base):
        self.name, self.rollgate = name, rollgate
        self.root = tempfile.mkdtemp(prefix=f"listen-bench-{name}-", dir=base)
        self.port = free_port()
        self.samples, self.outcomes, self.versions = [], {}, 0
        self.bad_windows = []  # (start, end) of deploys of bad releases (crash kind)
        self.proxy = None
        self.extra = []

    def add(self, kind):
        self.versions += 1
        version = f"v{self.versions}"
        body = f"#!/bin/sh\nexec '{self.rollgate}' sample-service {sample_args(kind, self.name != 'proxy')}\n"
        path = os.path.join(self.root, f".src-{version}")
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, 0o755)
        subprocess.run(
            [self.rollgate, "release", "add", "edge-svc", version, path, "--root", self.root],
            check=True, capture_output=True,
        )
        return version


class HeldSetup(Setup):
    """rollgate deploy with the policy's `listen` (and, for listen-kill, SIGKILLs)."""

    def __init__(self, name, rollgate, base, kills=0):
        super().__init__(name, rollgate, base)
        self.kills, self.killed = kills, 0
        self.policy = os.path.join(self.root, "policy.yaml")
        with open(self.policy, "w") as f:
            f.write(
                "edge_svc:\n  progress_deadline_ms: 1000\n  poll_ms: 50\n  max_unavailable_pct: 0\n"
                "  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 5000\n  watch_ms: 1500\n"
                f"  listen:\n    address: \"127.0.0.1:{self.port}\"\n"
            )

    def deploy(self, version, rng):
        command = [self.rollgate, "deploy", "edge-svc", version, "--root", self.root, "--policy", self.policy]
        if self.killed < self.kills:
            p = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0, 2.0))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                self.killed += 1
            p.wait()
            # What a person runs next: the same deploy again (it recovers first).
        out = subprocess.run(command, capture_output=True, text=True)
        return out.returncode

    def close(self):
        stop_root(self.root)


class ProxySetup(Setup):
    def __init__(self, name, rollgate, base):
        super().__init__(name, rollgate, base)
        first = free_port_block(2)
        self.ports = f"{first}-{first + 1}"
        self.policy = os.path.join(self.root, "policy.yaml")
        with open(self.policy, "w") as f:
            f.write(
                "edge_svc:\n  progress_deadline_ms: 1000\n  poll_ms: 50\n  max_unavailable_pct: 0\n"
                "  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 5000\n  watch_ms: 1500\n"
                "  drain_timeout_ms: 2000\n"
            )

    def start_proxy(self):
        self.proxy = subprocess.Popen(
            [self.rollgate, "proxy", "--listen", f"127.0.0.1:{self.port}", "--threads", "1", "--root", self.root],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_listening(self.port)

    def deploy(self, version, rng):
        out = subprocess.run(
            [self.rollgate, "deploy", "edge-svc", version, "--root", self.root, "--policy", self.policy,
             "--ports", self.ports],
            capture_output=True, text=True,
        )
        return out.returncode

    def close(self):
        if self.proxy:
            self.proxy.kill()
            self.proxy.wait()
        stop_root(self.root)


class RestartSetup(Setup):
    """Stop, then start, on one socket this script holds: no gate, no rollback."""

    def __init__(self, name, rollgate, base):
        super().__init__(name, rollgate, base)
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", self.port))
        self.socket.listen(4096)
        self.running = None

    def deploy(self, version, rng):
        if self.running is not None:
            self.running.send_signal(signal.SIGTERM)
            try:
                self.running.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.running.kill()
                self.running.wait()
        exe = os.path.join(self.root, "releases", version, "edge-svc")
        fd = self.socket.fileno()
        env = dict(os.environ, LISTEN_FDS="1", LISTEN_FDNAMES="http", PORT=str(free_port()),
                   ROLLGATE_VERSION=version)
        # The shell puts the socket on fd 3 and names its own pid, which the release keeps.
        self.running = subprocess.Popen(
            ["sh", "-c", f'exec 3<&{fd}; LISTEN_PID=$$ exec "$0"', exe], env=env, pass_fds=(fd,),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.root,
        )
        # As long as a gated deploy watches its release, with nothing to judge by.
        time.sleep(1.5)
        return 0

    def close(self):
        if self.running is not None:
            self.running.kill()
            self.running.wait()
        self.socket.close()


def free_port_block(n):
    for _ in range(200):
        first = random.randint(30000, 32000)
        try:
            socks = []
            for p in range(first, first + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            for s in socks:
                s.close()
            return first
        except OSError:
            for s in socks:
                s.close()
    raise SystemExit("no free block of ports")


def wait_listening(port, limit=10):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {port}")


def processes_in(root):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if not os.readlink(f"/proc/{name}/cwd").startswith(root):
                continue
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(name))
    return found


def named_pids(root):
    """What the root's state names: the live release, its fallback, the socket's holder."""
    pids = set()
    for name in ("current", "listen.json"):
        try:
            with open(os.path.join(root, name)) as f:
                record = json.load(f)
            pids.add(record["pid"])
            if record.get("fallback"):
                pids.add(record["fallback"]["pid"])
        except (OSError, ValueError, KeyError):
            pass
    return pids


def stop_root(root):
    stop_keepers(root)
    for pid in processes_in(root):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def main():
    rollgate = os.path.abspath(sys.argv[1])
    deploys = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    kills = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    rng = random.Random(seed)
    base = tempfile.mkdtemp(prefix="listen-bench-")
    setups = [HeldSetup("listen", rollgate, base), ProxySetup("proxy", rollgate, base),
              RestartSetup("restart", rollgate, base)]
    if kills:
        setups.append(HeldSetup("listen-kill", rollgate, base, kills))
    kinds = [BAD[(i // 5) % 3] if i % 5 == 4 else "good" for i in range(deploys)]
    # Every setup starts from a good release live.
    for setup in setups:
        version = setup.add("good")
        setup.deploy(version, rng)
        if isinstance(setup, ProxySetup):
            setup.start_proxy()
        wait_listening(setup.port)
    turns = [kinds[i:i + 10] for i in range(0, deploys, 10)]
    good_live_refused = {s.name: 0 for s in setups}
    for turn in turns:
        for setup in setups:
            load = Load(setup.port)
            load.start()
            for kind in turn:
                version = setup.add(kind)
                started = time.monotonic()
                code = setup.deploy(version, rng)
                setup.outcomes[kind] = setup.outcomes.get(kind, []) + [code]
                if kind != "good":
                    setup.bad_windows.append((started, time.monotonic() + 0.5))
                time.sleep(0.1)
            load.stop = True
            load.join()
            setup.samples.extend(load.samples)
    orphans = {}
    for setup in setups:
        if isinstance(setup, HeldSetup):
            named = named_pids(setup.root)
            orphans[setup.name] = [p for p in processes_in(setup.root) if p not in named]
    print(f"{deploys} deploys per setup (every fifth bad: boot, never ready, crash in the watch, in turn); seed {seed}")
    print("| setup | requests | refused | other failures | in a bad deploy's window | p50 ms | p99 ms | max ms | worst 100 ms window p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for setup in setups:
        samples = setup.samples
        lat = [l * 1000 for (_, l, _) in samples if l is not None]
        refused = sum(1 for (_, _, w) in samples if w == "refused")
        failed = [(t, w) for (t, _, w) in samples if w is not None and w != "refused"]
        in_crash = sum(1 for (t, w) in failed if any(a <= t <= b for a, b in setup.bad_windows))
        windows = {}
        for (t, l, _) in samples:
            if l is not None:
                windows.setdefault(int(t * 10), []).append(l * 1000)
        spike = max((percentile(v, 99) for v in windows.values() if len(v) >= 5), default=0.0)
        print(f"| {setup.name} | {len(samples)} | {refused} | {len(failed)} | {in_crash} | "
              f"{percentile(lat, 50):.2f} | {percentile(lat, 99):.2f} | {max(lat, default=0):.1f} | {spike:.1f} |")
        if setup.name.startswith("listen") and (refused or len(failed) > in_crash):
            ok = False
    for setup in setups:
        codes = {k: f"{sum(1 for c in v if c == 0)}/{len(v)} exit 0" for k, v in setup.outcomes.items()}
        print(f"{setup.name}: outcomes {codes}" + (f"; SIGKILLs {setup.killed}" if isinstance(setup, HeldSetup) and setup.kills else ""))
    for name, found in orphans.items():
        print(f"{name}: orphans {len(found)} {found}")
        ok = ok and not found
    for setup in setups:
        setup.close()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
