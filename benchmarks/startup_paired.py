"""Paired start-up timing of a photo command against the yardstick (issue 47).

``A`` (the command) and ``B`` (``python benchmarks/startup_yardstick.py``) are started in turn
(A B A B ...), each as a fresh process timed from outside: wall seconds (``perf_counter``
around ``subprocess``) and CPU seconds (user + system of the child, from ``os.wait4``). One
warm-up pair is not counted. The ratio ``A / B`` is taken pair by pair and its median printed
with the medians of A and B and the load average before and after.

Run from the folder holding the photos (``one/``, ``a.jpg``, ``b.jpg``, gallery ``g``)::

    PYTHONPATH=<tree>/src nice -n 10 python <tree>/benchmarks/startup_paired.py --pairs 7 \\
        -- python -m marginface verify dlib-resnet-v1 a.jpg a.jpg --detector mtcnn

``B`` runs with the same environment (the same ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

YARDSTICK = Path(__file__).with_name("startup_yardstick.py")


def timed(command: list[str]) -> tuple[float, float]:
    """``(wall s, cpu s)`` of one run of ``command`` (a non-zero exit is an error)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        error = process.stderr.read().decode() if process.stderr else ""
        raise SystemExit(f"{command} exited {process.returncode}: {error}")
    if process.stderr:
        process.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    """Parse ``--pairs N [--setup CMD] -- COMMAND...`` and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7, help="counted pairs (default 7)")
    parser.add_argument(
        "--setup", default=None, help="shell command run before each A (e.g. rm -rf al)"
    )
    parser.add_argument("command", nargs="+", help="A, after --")
    args = parser.parse_args()
    a_command = [sys.executable if c == "python" else c for c in args.command]
    b_command = [sys.executable, str(YARDSTICK)]
    rows = []
    load_before = os.getloadavg()[0]
    for k in range(args.pairs + 1):
        if args.setup:
            subprocess.run(args.setup, shell=True, check=True)
        a = timed(a_command)
        b = timed(b_command)
        if k:  # the first pair warms the caches and is not counted
            rows.append((a, b))
    median = statistics.median
    print(f"A: {' '.join(args.command)}")
    print(f"load average (1 min) before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}")
    print(
        f"A wall {median(a[0] for a, _ in rows):.2f} s (cpu {median(a[1] for a, _ in rows):.2f}),"
        f" B wall {median(b[0] for _, b in rows):.2f} s (cpu {median(b[1] for _, b in rows):.2f}),"
        f" A/B wall {median(a[0] / b[0] for a, b in rows):.2f},"
        f" A/B cpu {median(a[1] / b[1] for a, b in rows):.2f}, {len(rows)} pairs"
    )


if __name__ == "__main__":
    main()
