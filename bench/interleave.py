#!/usr/bin/env python3
"""Wall time of short commands, run interleaved (A B A B ...) so that a shared machine's drift
hits every command alike. Prints mean, median and p90 per command and each median's ratio to
the last command's, and the median CPU time (user + system, the command and its children),
which a busy neighbour disturbs less than wall time. This script makes itself a child
subreaper, so the CPU column also counts processes a command left to finish on their own (the
policy evaluator exits after its parent has printed the answer); the wall column stops when the
command itself exits.

Usage: python3 bench/interleave.py RUNS 'command one' 'command two' ...
"""
import os
import shlex
import statistics
import subprocess
import sys
import ctypes
import time

PR_SET_CHILD_SUBREAPER = 36


def run(argv):
    """Wall ms and CPU ms (user + system, with the command's own children) of one run."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as null:
        process = subprocess.Popen(argv, stdout=null, stderr=null)
        _, _, usage = os.wait4(process.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    process.returncode = 0  # reaped above
    used = usage.ru_utime + usage.ru_stime
    while True:  # orphans of the command, reparented to us
        try:
            _, _, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        used += usage.ru_utime + usage.ru_stime
    return wall, used * 1000


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("interleave.py: cannot become a child subreaper (Linux only)")
    runs = int(sys.argv[1])
    commands = sys.argv[2:]
    argvs = [shlex.split(c) for c in commands]
    times = [[] for _ in commands]
    cpu = [[] for _ in commands]
    for _ in range(3):  # warm-up: page cache, dynamic loader cache
        for argv in argvs:
            run(argv)
    for _ in range(runs):
        for i, argv in enumerate(argvs):
            wall, used = run(argv)
            times[i].append(wall)
            cpu[i].append(used)
    reference = statistics.median(times[-1])
    cpu_reference = statistics.median(cpu[-1])
    for command, t, c in zip(commands, times, cpu):
        t.sort()
        median = statistics.median(t)
        cpu_median = statistics.median(c)
        print(
            f"{command}\n    wall: mean {statistics.mean(t):.2f} ms  median {median:.2f} ms"
            f"  p90 {t[int(len(t) * 0.9)]:.2f} ms  median/last {median / reference:.3f}"
            f"\n    cpu:  median {cpu_median:.2f} ms  median/last {cpu_median / cpu_reference:.3f}"
        )


main()
