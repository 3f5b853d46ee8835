#!/usr/bin/env python3
"""Writes a synthetic deploy log: N attempts (candidate_started + outcome each), with noise.

Usage: python3 bench/gen_log.py ATTEMPTS OUT.log [--torn]
About 1 in 5 attempts is rolled back (three reasons), 1 in 1000 lines is noise (a comment,
a blank line, an indented record). With --torn the last line is cut short, as after a crash
(the lesson's Nushell query then fails outright, so comparisons use a log without it).
"""
import random
import sys

attempts, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(7)
reasons = [
    "not ready after 1500 ms; old release v{old} still answering; last probes: HTTP 503",
    "candidate exited with exit status: 78 before ready; old release v{old} still answering",
    "candidate exited with signal: 9 (SIGKILL) before ready; old release v{old} still answering",
]
ts = 1_790_000_000.0
live = 0
with open(out, "w") as f:
    for i in range(1, attempts + 1):
        ts += rng.uniform(30, 600)
        port = 8000 + i % 1000
        f.write('{"ts":%.3f,"event":"candidate_started","version":"v%d","detail":"port %d; pid %d; deadline 1500 ms (policy); poll 100 ms","service":"edge-svc","port":%d,"pid":%d}\n'
                % (ts, i, port, 1000 + i % 30000, port, 1000 + i % 30000))
        ts += rng.uniform(0.2, 1.6)
        if rng.random() < 0.2:
            detail = rng.choice(reasons).format(old=live)
            f.write('{"ts":%.3f,"event":"rolled_back","version":"v%d","detail":"%s","service":"edge-svc","port":%d,"elapsed_ms":%d}\n'
                    % (ts, i, detail, port, rng.randint(5, 1500)))
        else:
            f.write('{"ts":%.3f,"event":"promoted","version":"v%d","detail":"ready after %d ms (%d probes); old release v%d stopped (SIGTERM)","service":"edge-svc","port":%d,"elapsed_ms":%d}\n'
                    % (ts, i, rng.randint(100, 1500), rng.randint(1, 15), live, port, rng.randint(100, 1500)))
            live = i
        if i % 500 == 0:
            f.write(rng.choice(["# rotated by logrotate\n", "\n", '   {"event":"promoted","version":"indented"}\n']))
    if "--torn" in sys.argv[3:]:
        f.write('{"ts":%.3f,"event":"candidate_started","version":"v%d","det' % (ts + 1, attempts + 1))
