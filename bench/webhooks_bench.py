#!/usr/bin/env python3
"""Does a webhook receiver that never answers slow a deploy? Deploys timed side by side.

usage: bench/webhooks_bench.py ROLLGATE [ROUNDS]

One root, releases v1 and v2 (the sample service). ROUNDS pairs of deploys (default 10),
alternating: one with no sender at all, one while `rollgate console` runs on the root and sends
its webhooks to an endpoint on 127.0.0.1 that accepts connections and never answers (every
record of every deploy is due to it, each attempt waits its 10 s, then backs off). Prints
each condition's median and mean deploy time and the difference.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import free_port

ROLLGATE = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo="


def never_answers():
    """A receiver that takes every connection and holds it without a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []

    def accept():
        while True:
            connection, _ = listener.accept()
            held.append(connection)

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def main():
    with tempfile.TemporaryDirectory() as root:
        for version in ("v1", "v2"):
            os.makedirs(f"{root}/releases/{version}")
            path = f"{root}/releases/{version}/edge-svc"
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\nexec '{ROLLGATE}' sample-service\n")
            os.chmod(path, 0o755)
        subprocess.run([ROLLGATE, "deploy", "edge-svc", str(free_port()), "v1", "--root", root],
                       check=True, capture_output=True)
        hook = never_answers()
        with open(f"{root}/webhooks.json", "w") as f:
            json.dump({"endpoints": [{"name": "silent", "url": f"http://127.0.0.1:{hook}/hook",
                                      "secret": SECRET}]}, f)
        times = {"no sender": [], "sender to a silent receiver": []}
        version = "v2"
        for round in range(ROUNDS * 2):
            condition = "no sender" if round % 2 == 0 else "sender to a silent receiver"
            console = None
            if condition != "no sender":
                console = subprocess.Popen([ROLLGATE, "console", "--root", root,
                                            "--listen", f"127.0.0.1:{free_port()}"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.5)  # its sender has seen the endpoint and holds an attempt open
            started = time.monotonic()
            subprocess.run([ROLLGATE, "deploy", "edge-svc", str(free_port()), version,
                            "--root", root], check=True, capture_output=True)
            times[condition].append(time.monotonic() - started)
            if console:
                console.kill()
                console.wait()
            version = "v1" if version == "v2" else "v2"
        base = statistics.median(times["no sender"])
        for condition, values in times.items():
            median = statistics.median(values)
            print(f"{condition:30} median {median * 1000:7.1f} ms, mean "
                  f"{statistics.mean(values) * 1000:7.1f} ms ({len(values)} deploys), "
                  f"{(median / base - 1) * 100:+.1f} %")


if __name__ == "__main__":
    main()
