"""Wall time of a 6-candidate learning-rate sweep with `--jobs 2` against `--jobs 1`.

Runs `nandoctor sweep-lr` on tests/scripts/lr_diverging_sgd.py with a config that makes the
sweep try exactly the six multipliers 1/2 ... 1/64 (no early stop, no refinement, no
verification run), alternating the two settings (1, 2, 2, 1, ...) so that a noisy neighbour
hurts both alike. Prints each run, then the ratio jobs 2 / jobs 1 of the sweep stage's own time
and of the whole command (which also includes the watched run), as medians over the rounds.

    python benchmarks/bench_sweep_jobs.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "lr_diverging_sgd.py"
CONFIG = """\
lr_sweep:
  halvings: 6               # multipliers 1/2 ... 1/64: six candidates
  stable_in_a_row: 7        # never satisfied: every halving runs
  refine_rounds: 0          # no refinement runs
  verify_recommendation: false
  clip_experiment: false
"""


def sweep_once(jobs: int, folder: Path) -> tuple[float, float, int]:
    """(command wall time, sweep stage time, candidates run) of one `nandoctor sweep-lr`."""
    report = folder / f"report-{jobs}-{time.monotonic_ns()}.json"
    command = [sys.executable, "-m", "nandoctor", "sweep-lr", str(SCRIPT), "--jobs", str(jobs),
               "--config", str(folder / "bench.yaml"), "--json", str(report)]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False, cwd=ROOT)
    wall = time.perf_counter() - started
    stage = json.loads(report.read_text())["stages"]["lr_sweep"]
    candidates = sum(1 for run in stage["runs"] if run.get("purpose") != "watched")
    candidates += len(stage.get("stopped_early", []))
    return wall, stage["duration_s"], candidates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="pairs of (jobs 1, jobs 2) runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "bench.yaml").write_text(CONFIG)
        times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
        for round_ in range(args.rounds):
            for jobs in (1, 2) if round_ % 2 == 0 else (2, 1):
                wall, stage, candidates = sweep_once(jobs, folder)
                times[jobs].append((wall, stage))
                print(f"round {round_ + 1}  --jobs {jobs}: sweep {stage:6.1f}s, "
                      f"command {wall:6.1f}s, {candidates} candidates")  # fmt: skip
    stage_ratio = statistics.median(t[1] for t in times[2]) / statistics.median(
        t[1] for t in times[1]
    )
    wall_ratio = statistics.median(t[0] for t in times[2]) / statistics.median(
        t[0] for t in times[1]
    )
    print(
        f"ratio --jobs 2 / --jobs 1: sweep stage {stage_ratio:.2f}, whole command {wall_ratio:.2f}"
    )


if __name__ == "__main__":
    main()
