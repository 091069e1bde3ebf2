"""Cost of diagnosing a failure that comes late, or in a big model: `nandoctor run` (default
flags) against the plain script's time to the failure.

Workloads in `benchmarks/late/`: a corrupt data row first drawn late, a slow-onset overflow in a
hand-written softmax, a warm-up to a peak learning rate that is too high (each set to fail at
about step 300, 3,000 and 10,000 with `--fail-at`), and a 55M-parameter MLP whose log(0) comes
at step 3. Each workload stops at its first non-finite loss, so its plain time is the time to
the failure. For each it prints the plain time, the whole command's time and their ratio, each
stage's share, the peak memory of all the command's processes together (rewind points
included) against the plain run's, the verdict (status, top cause, its line and whether its fix
was verified), and the step each re-run started from.

    python benchmarks/bench_late_failure.py [--only corrupt_row,big] [--fail-at 300,3000,10000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LATE = Path(__file__).resolve().parent / "late"
STEPPED = ("corrupt_row", "slow_exp_overflow", "warmup_peak")
BIG = "big_model_log_zero"
# Each sample walks /proc: sampled more often, it takes a core's share from the runs it measures
# on a small machine. The processes it looks for live for seconds.
_SAMPLE_S = 0.25


def measured(command: list[str], cwd: str) -> tuple[float, int]:
    """Wall seconds of `command`, and the peak of the memory its processes use together, in MB:
    the sum of their proportional set sizes (PSS: a page shared by a fork and its parent counts
    half to each), sampled every 250 ms. Its processes: its descendants, and those whose command
    line names `cwd` (rewind points outlive the run that forked them and are adopted by init;
    nandoctor's temp folder, under `cwd` here, is in theirs)."""
    env = {**os.environ, "TMPDIR": cwd}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    peak_kb = 0
    while process.poll() is None:
        peak_kb = max(peak_kb, sum(map(_pss_kb, _processes_of(process.pid, cwd))))
        time.sleep(_SAMPLE_S)
    return time.monotonic() - started, peak_kb // 1024


def _processes_of(root: int, marker: str) -> set[int]:
    parents, named = {}, set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if marker.encode() in file.read():
                    named.add(int(entry))
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier += children
    return found | named


def _pss_kb(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/smaps_rollup",
                                                       encoding="ascii") as file:  # fmt: skip
        for line in file:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def top_cause(report: dict) -> str:
    causes = report.get("causes") or []
    if not causes:
        return f"{report['status']}, no cause"
    top = causes[0]
    line = top["location"]["line"] if top.get("location") else "-"
    verified = {True: "verified", False: "not verified", None: "no re-run"}[top.get("verified_fix")]
    return f"{report['status']}: {top['category']} at line {line}, fix {verified}"


def bench(script: str, args: list[str]) -> dict:
    path = str(LATE / f"{script}.py")
    with tempfile.TemporaryDirectory(prefix="bench-late-") as scratch:
        plain_s, plain_mb = measured([sys.executable, path, *args], scratch)
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "nandoctor", "run", path, "--json", str(report_path),
                   "--", *args]  # fmt: skip
        run_s, run_mb = measured(command, scratch)
        report = json.loads(report_path.read_text())
    stages = {name: stage.get("duration_s") or 0.0 for name, stage in report["stages"].items()}
    return {
        "script": script,
        "args": " ".join(args),
        "failed_at": (report.get("run") or {}).get("steps_observed"),
        "plain_s": plain_s,
        "run_s": run_s,
        "ratio": run_s / plain_s,
        "plain_mb": plain_mb,
        "run_mb": run_mb,
        "stages": stages,
        "verdict": top_cause(report),
        "reruns": (report.get("run") or {}).get("reruns", []),
    }


def print_row(row: dict) -> None:
    shares = ", ".join(f"{name} {seconds / row['plain_s']:.2f}x"
                       for name, seconds in row["stages"].items() if seconds >= 0.05)  # fmt: skip
    # the stages' own times leave out fix verification and start-up
    rest = row["run_s"] - sum(row["stages"].values())
    shares += f", verification and start-up {rest / row['plain_s']:.2f}x"
    print(f"{row['script']:20} {row['args']:15} step {row['failed_at']!s:>6}  "
          f"plain {row['plain_s']:6.1f}s  run {row['run_s']:6.1f}s  {row['ratio']:5.2f}x  "
          f"memory {row['run_mb']} MB vs {row['plain_mb']} MB")  # fmt: skip
    print(f"{'':20} stages: {shares}")
    print(f"{'':20} {row['verdict']}")
    starts = ", ".join(f"{r['run']} from {r['from_step']}" for r in row["reruns"])
    print(f"{'':20} re-runs: {starts or 'none'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated workloads (corrupt_row, slow_exp_overflow, "
                        "warmup_peak, big)")  # fmt: skip
    parser.add_argument("--fail-at", default="300,3000,10000", help="steps to fail at")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else {*STEPPED, "big"}
    rows = []
    for fail_at in [int(s) for s in args.fail_at.split(",")]:
        for script in STEPPED:
            if script in wanted:
                rows.append(bench(script, ["--fail-at", str(fail_at)]))
                print_row(rows[-1])
    if "big" in wanted:
        rows.append(bench(BIG, []))
        print_row(rows[-1])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
