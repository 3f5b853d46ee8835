#!/usr/bin/env python3
"""The console's page for a rollout of 1000 replicas, in a real headless Chromium.

usage: bench/console_bench.py ROLLGATE [ROUNDS]

Makes a root whose state files describe a rollout of 1000 replicas half-way (the state a real
6-replica rollout wrote, widened to 1000 slots in the default waves; the replicas' processes do
not run, which the page shows), starts `rollgate console --read-only` on it, and loads the
page ROUNDS times (default 10) in Chromium through ChromeDriver, timing each load from the
navigation's start to its load event (the Navigation Timing API). Prints the times, the
page's size, and the console's peak RSS (VmHWM) afterwards.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchlib import free_port

ROLLGATE = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
REPLICAS = 1000


def wave_sizes(n, percents=(1, 10, 50, 100)):
    sizes, previous = [], 0
    for pct in percents:
        if previous == n:
            break
        size = min(n, max(previous + 1, -(-n * pct // 100)))
        sizes.append(size)
        previous = size
    if previous < n:
        sizes.append(n)
    return sizes


def make_root(root):
    now = time.time()
    sizes = wave_sizes(REPLICAS)
    waves, start = [], 0
    for end in sizes:
        waves.append(list(range(start, end)))
        start = end
    slots, replicas = [], []
    for slot in range(REPLICAS):
        wave = next(i for i, w in enumerate(waves) if slot in w)
        done = wave < 2
        version = "v2" if done else "v1"
        live = {"version": version, "port": 40000 + slot, "pid": 999999, "start_time": 1,
                "token": f"r1.1-{slot}-1.{slot}"}
        slots.append({"slot": slot, "class": "required" if slot % 50 == 0 else "best_effort",
                      "state": "succeeded" if done else ("failed" if slot == 150 else "pending"),
                      "live": live, "candidate": None, "wave": wave, "from_version": "v1",
                      "retiring": None, "left_pool": False, "started": now - 30,
                      "finished": now - 10 if done else None,
                      "error": "candidate exited with exit status: 1 before ready" if slot == 150 else None})
        replicas.append({"slot": slot, "version": version, "port": 40000 + slot, "pid": 999999,
                         "start_time": 1, "class": "best_effort"})
    template = json.load(open(os.path.join(os.path.dirname(__file__), "console_rollout.json")))
    template.update({"slots": slots, "waves": waves, "wave": 2, "phase": "running",
                     "started_at": now - 30, "soak_until": now + 20})
    template["settings"]["replicas"] = REPLICAS
    template["settings"]["release_deadline"] = now + 600
    json.dump(template, open(os.path.join(root, "rollout.json"), "w"))
    json.dump({"service": "edge-svc", "replicas": replicas}, open(os.path.join(root, "replicas.json"), "w"))
    with open(os.path.join(root, "deploy.log"), "w") as log:
        for i in range(200):
            event = "promoted" if i % 3 else "rolled_back"
            log.write(json.dumps({"ts": now - 86400 + i * 300, "event": event, "version": f"v{i}",
                                  "service": "edge-svc", "detail": "reason; more",
                                  "elapsed_ms": 300}) + "\n")


def webdriver(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=120))["value"]


def main():
    with tempfile.TemporaryDirectory() as root:
        make_root(root)
        port = free_port()
        console = subprocess.Popen([ROLLGATE, "console", "--read-only", "--root", root,
                                    "--listen", f"127.0.0.1:{port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        driver_port = free_port()
        driver = subprocess.Popen(["chromedriver", f"--port={driver_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        try:
            session = webdriver(driver_port, "POST", "/session", {"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--no-first-run",
                    f"--user-data-dir={root}/profile"]}}}})["sessionId"]
            times = []
            for _ in range(ROUNDS):
                webdriver(driver_port, "POST", f"/session/{session}/url", {"url": "about:blank"})
                webdriver(driver_port, "POST", f"/session/{session}/url", {"url": f"http://127.0.0.1:{port}/"})
                timing = webdriver(driver_port, "POST", f"/session/{session}/execute/sync", {
                    "script": "var t = performance.getEntriesByType('navigation')[0]; "
                              "return [t.responseStart - t.startTime, t.loadEventEnd - t.startTime, "
                              "document.querySelectorAll('table.slots tr').length];", "args": []})
                times.append(timing)
            size = len(urllib.request.urlopen(f"http://127.0.0.1:{port}/").read())
            rss = next(line.split()[1] for line in open(f"/proc/{console.pid}/status")
                       if line.startswith("VmHWM"))
            loads = [t[1] for t in times]
            first_bytes = [t[0] for t in times]
            print(f"replicas {REPLICAS}, rows rendered {times[-1][2] - 1}, page {size / 1024:.0f} KiB")
            print(f"first byte: median {statistics.median(first_bytes):.0f} ms, max {max(first_bytes):.0f} ms")
            print(f"load event: median {statistics.median(loads):.0f} ms, max {max(loads):.0f} ms "
                  f"({ROUNDS} loads)")
            print(f"console peak RSS: {int(rss) / 1024:.1f} MiB")
        finally:
            driver.kill()
            console.kill()


if __name__ == "__main__":
    main()
