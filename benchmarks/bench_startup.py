"""CLI start-up: `nandoctor --help` against a bare `python -c pass`, median of several runs.

python benchmarks/bench_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def median_seconds(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    bare = median_seconds([sys.executable, "-c", "pass"], args.runs)
    help_ = median_seconds([sys.executable, "-m", "nandoctor", "--help"], args.runs)
    print(
        f"nandoctor --help: {help_:.3f} s (python alone: {bare:.3f} s, ratio {help_ / bare:.1f}x)"
    )


if __name__ == "__main__":
    main()
