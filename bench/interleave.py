#!/usr/bin/env python3
"""Wall time of short commands, run interleaved (A B A B ...) so that a shared machine's drift
hits every command alike. Prints mean, median and p90 per command and each median's ratio to
the last command's.

Usage: python3 bench/interleave.py RUNS 'command one' 'command two' ...
"""
import shlex
import statistics
import subprocess
import sys
import time


def main():
    runs = int(sys.argv[1])
    commands = sys.argv[2:]
    argvs = [shlex.split(c) for c in commands]
    times = [[] for _ in commands]
    for _ in range(3):  # warm-up: page cache, dynamic loader cache
        for argv in argvs:
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(runs):
        for i, argv in enumerate(argvs):
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[i].append((time.perf_counter() - start) * 1000)
    reference = statistics.median(times[-1])
    for command, t in zip(commands, times):
        t.sort()
        median = statistics.median(t)
        print(
            f"{command}\n    mean {statistics.mean(t):.2f} ms  median {median:.2f} ms"
            f"  p90 {t[int(len(t) * 0.9)]:.2f} ms  median/last {median / reference:.3f}"
        )


main()
