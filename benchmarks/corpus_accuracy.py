"""Diagnosis accuracy on the labelled corpus, split by split.

Two manifests: `corpus/manifest.yaml` is the dev split (rules may be tuned on it), and
`corpus/test/manifest.yaml` the test split, labelled from public bug reports and never used to
tune a rule. Runs `python -m nandoctor run SCRIPT --json REPORT [-- args]` on every script and
compares the report with the label: top-1 and top-3 category, the top cause's line against
the culprit line, false alarms on the healthy scripts, sick scripts called healthy (or
inconclusive), top causes with a verified fix, and the wall time per script. `--reports DIR`
keeps each script's JSON report there (`test__learning_rate__x.json`), to read why a script
came out as it did without running it again.

    python benchmarks/corpus_accuracy.py [--split dev|test|all] [--profile standard] [--jobs 2]
                                         [--only data,healthy/] [--json results.json]
                                         [--reports DIR]
    python benchmarks/corpus_accuracy.py --plain    # check the labels with plain python

`--plain` runs every script with plain python and checks that the buggy ones print NaN/Inf
(on stdout or stderr) and the healthy ones do not, which is what makes the labels true. Entries
with `nproc_per_node` > 1 run through `python -m torch.distributed.run --standalone` in both
modes (`--nproc-per-node N` for nandoctor). Scripts that need CUDA are skipped (and reported as
skipped) without a CUDA device. A sick script that nandoctor calls healthy is run once more
with plain python: when that run prints no NaN/Inf either, its label does not reproduce on this
machine (float results differ between CPUs and thread counts, and some scripts sit near the
edge), and it is reported as skipped rather than missed. Each script runs in a scratch
directory, so log files and checkpoints land there. Exit code 0 when the targets are met, 1
otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from nandoctor.report.model import CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
MANIFESTS = {"dev": CORPUS / "manifest.yaml", "test": CORPUS / "test" / "manifest.yaml"}
PHASES = (None, "data", "forward", "backward", "optimizer")
# `cuda`: a CUDA device; the others are Python packages the script imports beyond torch.
KNOWN_REQUIREMENTS = {"cuda", "transformers", "lightning", "accelerate", "timm"}
FRAMEWORKS = {"transformers", "lightning", "accelerate", "timm"}
TARGETS = {
    "dev": {"top1": 0.95, "top3": 1.0, "line": 1.0, "false_alarms": 0, "missed": 0,
            "verified": 0.0, "median_s": 30.0},
    "test": {"top1": 0.90, "top3": 0.98, "line": 0.95, "false_alarms": 0, "missed": 0,
             "verified": 0.80, "median_s": 30.0},
}  # fmt: skip
PLAIN_TIMEOUT_S = 60
RUN_TIMEOUT_S = 1800  # nandoctor's own limit is per child run; this guards the whole command
# A printed NaN/Inf: `nan`, `inf`, `-inf`, `NaN`, `Infinity`, not part of a word like `info`.
NONFINITE_TEXT = re.compile(r"(?<![A-Za-z])[-+]?(nan|inf|infinity)(?![A-Za-z])", re.IGNORECASE)


@dataclass(frozen=True)
class Entry:
    path: str
    category: str
    culprit_line: int | None
    phase: str | None = None
    requires: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    style: str = ""
    why: str = ""
    split: str = "dev"
    source: str = ""  # the public report a test-split script reproduces
    fix: str = ""  # how its maintainers fixed it
    framework: str | None = None  # transformers | lightning | accelerate | timm
    public_script: str | None = None  # a well-known public script, run unmodified

    @property
    def file(self) -> Path:
        return CORPUS / self.path

    @property
    def healthy(self) -> bool:
        return self.category == "healthy"

    @property
    def arguments(self) -> list[str]:
        """The script's arguments, `{dir}` standing for its folder (data next to it)."""
        return [a.replace("{dir}", str(self.file.parent)) for a in self.args]


@dataclass
class Outcome:
    path: str
    expected: str
    skipped: str | None = None
    status: str | None = None
    exit_code: int | None = None
    got: list[str] = field(default_factory=list)
    top1: bool | None = None
    top3: bool | None = None
    culprit_line: int | None = None
    got_line: int | None = None
    got_file: str | None = None
    line_ok: bool | None = None
    false_alarm: bool | None = None
    missed: bool | None = None  # a sick script reported healthy or inconclusive
    verified: bool | None = None  # the top cause's fix was verified by a re-run
    first_op: str | None = None
    top_code: str | None = None
    # Every finding the report made that could be a cause: (code, category), once per code.
    claims: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


def load_manifest(split: str = "dev") -> list[Entry]:
    """The split's entries, checked against the files: raises ValueError on any mismatch. Paths
    are relative to corpus/ (the test split's start with `test/`)."""
    path = MANIFESTS[split]
    prefix = path.parent.relative_to(CORPUS).as_posix()
    raw = yaml.safe_load(path.read_text())
    entries = [
        Entry(
            path=item["path"] if prefix == "." else f"{prefix}/{item['path']}",
            category=item["category"],
            culprit_line=item.get("culprit_line"),
            phase=item.get("phase"),
            requires=tuple(item.get("requires") or ()),
            args=tuple(str(a) for a in item.get("args") or ()),
            nproc_per_node=item.get("nproc_per_node", 1),
            style=item.get("style", ""),
            why=item.get("why", ""),
            split=split,
            source=item.get("source", ""),
            fix=item.get("fix", ""),
            framework=item.get("framework"),
            public_script=item.get("public_script"),
        )
        for item in raw["scripts"]
    ]
    problems = [problem for entry in entries for problem in check_entry(entry)]
    paths = [entry.path for entry in entries]
    problems += [f"{p}: listed twice" for p in sorted({p for p in paths if paths.count(p) > 1})]
    if problems:
        raise ValueError(
            f"{path.relative_to(ROOT)} does not match the files:\n  " + "\n  ".join(problems)
        )
    return entries


def check_entry(entry: Entry) -> list[str]:
    problems = []
    if entry.category not in (*CATEGORIES, "healthy"):
        problems.append(f"{entry.path}: unknown category {entry.category!r}")
    if entry.phase not in PHASES:
        problems.append(f"{entry.path}: unknown phase {entry.phase!r}")
    if unknown := set(entry.requires) - KNOWN_REQUIREMENTS:
        problems.append(f"{entry.path}: unknown requirement {sorted(unknown)}")
    if entry.framework is not None and entry.framework not in FRAMEWORKS:
        problems.append(f"{entry.path}: unknown framework {entry.framework!r}")
    if entry.framework is not None and entry.framework not in entry.requires:
        problems.append(f"{entry.path}: a {entry.framework} script must require it")
    if type(entry.nproc_per_node) is not int or entry.nproc_per_node < 1:
        problems.append(f"{entry.path}: nproc_per_node must be a positive integer")
    if not entry.file.is_file():
        return [*problems, f"{entry.path}: no such file"]
    if entry.healthy and entry.culprit_line is not None:
        problems.append(f"{entry.path}: a healthy script has no culprit line")
    if entry.culprit_line is not None:
        lines = entry.file.read_text().splitlines()
        if not 1 <= entry.culprit_line <= len(lines):
            problems.append(f"{entry.path}: culprit line {entry.culprit_line} is past the end")
        elif not lines[entry.culprit_line - 1].strip():
            problems.append(f"{entry.path}: culprit line {entry.culprit_line} is blank")
    return problems


def cuda_available() -> bool:
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() == "True"


def skip_reason(entry: Entry, has_cuda: bool) -> str | None:
    if "cuda" in entry.requires and not has_cuda:
        return "needs CUDA"
    missing = [p for p in entry.requires if p != "cuda" and importlib.util.find_spec(p) is None]
    if missing:
        return f"needs {', '.join(missing)} (pip install -e '.[frameworks]')"
    return None


def plain_command(entry: Entry) -> list[str]:
    """`python SCRIPT ARGS`, or the same through torchrun when the entry asks for more than one
    process."""
    n = entry.nproc_per_node
    if n == 1:
        return [sys.executable, str(entry.file), *entry.arguments]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
    return [sys.executable, *launcher, str(entry.file), *entry.arguments]


def run_plain(entry: Entry, expect_nonfinite: bool) -> Outcome:
    """The script under plain python (or torchrun): it must print NaN/Inf exactly when
    `expect_nonfinite`, and exit normally unless it is sick."""
    outcome = Outcome(entry.path, entry.category, culprit_line=entry.culprit_line)
    with tempfile.TemporaryDirectory(prefix="corpus-plain-") as scratch:
        started = time.monotonic()
        try:
            done = subprocess.run(
                plain_command(entry),
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=PLAIN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            outcome.seconds = time.monotonic() - started
            outcome.error = f"timed out after {PLAIN_TIMEOUT_S} s"
            outcome.top1 = False
            return outcome
        outcome.seconds = time.monotonic() - started
    outcome.exit_code = done.returncode
    # Scripts that log through `logging` print to stderr.
    printed_nonfinite = bool(NONFINITE_TEXT.search(done.stdout + done.stderr))
    outcome.status = "nonfinite" if printed_nonfinite else "finite"
    if done.returncode != 0:
        outcome.error = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    # A sick script may die of its NaN (an op that rejects it); a healthy one must end cleanly.
    ended_as_expected = done.returncode == 0 or expect_nonfinite
    outcome.top1 = ended_as_expected and printed_nonfinite == expect_nonfinite
    return outcome


def run_nandoctor(entry: Entry, profile: str, reports: Path | None = None) -> Outcome:
    outcome = Outcome(entry.path, entry.category, culprit_line=entry.culprit_line)
    with tempfile.TemporaryDirectory(prefix="corpus-run-") as scratch:
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "nandoctor", "run", str(entry.file)]
        command += ["--json", str(report_path), "--profile", profile]
        if entry.nproc_per_node > 1:
            command += ["--nproc-per-node", str(entry.nproc_per_node)]
        if entry.args:
            command += ["--", *entry.arguments]
        started = time.monotonic()
        try:
            done = subprocess.run(
                command,
                cwd=scratch,
                capture_output=True,
                text=True,
                env=dict(os.environ, COLUMNS="120"),
                timeout=RUN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(
                command, None, "", f"timed out after {RUN_TIMEOUT_S} s"
            )
        outcome.seconds = time.monotonic() - started
        outcome.exit_code = done.returncode
        if not report_path.exists():
            outcome.error = (done.stderr.strip().splitlines() or ["no report written"])[-1]
            outcome.top1 = outcome.top3 = False
            outcome.line_ok = False if entry.culprit_line is not None else None
            outcome.false_alarm = True if entry.healthy else None
            return outcome
        report = json.loads(report_path.read_text())
        if reports is not None:  # kept to read why a script came out as it did
            kept = reports / entry.path.replace("/", "__")
            shutil.copyfile(report_path, kept.with_suffix(".json"))
    score(entry, report, outcome)
    if outcome.missed and not run_plain(entry, expect_nonfinite=True).top1:
        # Called healthy, and plain python printed no NaN/Inf here either: the label does not
        # reproduce on this machine (its numerics differ from where the script was written),
        # so the run says nothing about the diagnosis. Counted apart, as a skip.
        outcome.skipped = "no NaN/Inf under plain python on this machine either"
    return outcome


def score(entry: Entry, report: dict, outcome: Outcome) -> None:
    """Fill the outcome's verdicts from a report."""
    causes = report.get("causes") or []
    outcome.status = report.get("status")
    outcome.got = [cause["category"] for cause in causes]
    first = report.get("first_nonfinite") or {}
    outcome.first_op = first.get("op")
    outcome.top_code = causes[0].get("code") if causes else None
    claims = {}
    for finding in report.get("findings") or []:
        if finding.get("severity") in ("error", "warning") and finding.get("code"):
            claims.setdefault(finding["code"], finding["category"])
    outcome.claims = sorted(claims.items())
    if entry.healthy:
        outcome.false_alarm = outcome.status != "healthy" or bool(causes)
        outcome.top1 = outcome.top3 = not outcome.false_alarm
        return
    outcome.missed = outcome.status in ("healthy", "inconclusive")
    outcome.verified = bool(causes) and causes[0].get("verified_fix") is True
    outcome.top1 = bool(causes) and causes[0]["category"] == entry.category
    outcome.top3 = entry.category in outcome.got[:3]
    location = causes[0].get("location") if causes else None
    if location:
        outcome.got_line = location.get("line")
        outcome.got_file = location.get("file")
    if entry.culprit_line is not None:
        outcome.line_ok = (
            outcome.got_line == entry.culprit_line
            and outcome.got_file is not None
            and Path(outcome.got_file).name == entry.file.name
        )


def summarize(outcomes: list[Outcome], entries: list[Entry]) -> dict:
    by_path = {entry.path: entry for entry in entries}
    ran = [o for o in outcomes if o.skipped is None]
    buggy = [o for o in ran if not by_path[o.path].healthy]
    healthy = [o for o in ran if by_path[o.path].healthy]
    with_line = [o for o in buggy if by_path[o.path].culprit_line is not None]
    seconds = [o.seconds for o in ran]

    def ratio(hits: int, total: int) -> float | None:
        return hits / total if total else None

    return {
        "scripts": len(outcomes),
        "skipped": len(outcomes) - len(ran),
        "buggy": len(buggy),
        "healthy": len(healthy),
        "top1": ratio(sum(bool(o.top1) for o in buggy), len(buggy)),
        "top3": ratio(sum(bool(o.top3) for o in buggy), len(buggy)),
        "line": ratio(sum(bool(o.line_ok) for o in with_line), len(with_line)),
        "with_line": len(with_line),
        "false_alarms": sum(bool(o.false_alarm) for o in healthy),
        "missed": sum(bool(o.missed) for o in buggy),
        "verified": ratio(sum(bool(o.verified) for o in buggy), len(buggy)),
        "median_s": statistics.median(seconds) if seconds else None,
        "max_s": max(seconds) if seconds else None,
        "top1_by_group": top1_by_group(buggy, by_path),
    }


def top1_by_group(buggy: list[Outcome], by_path: dict) -> dict:
    """Top-1 hits and totals per category, and for framework and public-script entries."""
    groups: dict[str, list[int]] = {}
    for o in buggy:
        entry = by_path[o.path]
        for group in (entry.category, entry.framework and f"framework:{entry.framework}",
                      entry.public_script and "public script"):  # fmt: skip
            if group:
                hits = groups.setdefault(group, [0, 0])
                hits[0] += bool(o.top1)
                hits[1] += 1
    return dict(sorted(groups.items()))


def targets_met(summary: dict, targets: dict) -> bool:
    def at_least(key: str) -> bool:
        return summary[key] is None or summary[key] >= targets[key]

    return (
        at_least("top1")
        and at_least("top3")
        and at_least("line")
        and at_least("verified")
        and summary["false_alarms"] <= targets["false_alarms"]
        and summary["missed"] <= targets["missed"]
        and (summary["median_s"] is None or summary["median_s"] < targets["median_s"])
    )


def mark(value: bool | None) -> str:
    return {True: "ok", False: "FAIL", None: "-"}[value]


def print_table(outcomes: list[Outcome]) -> None:
    w = max(len(o.path) for o in outcomes)
    header = f"{'script':{w}} {'expected':19} {'got (top 3)':48} {'top1':4} {'top3':4} {'line':14} {'s':>6}"
    print(header)
    print("-" * len(header))
    for o in outcomes:
        if o.skipped:
            print(f"{o.path:{w}} {o.expected:19} {'skipped: ' + o.skipped:48}")
            continue
        got = ", ".join(o.got[:3]) or (o.status or "?")
        line = (
            "-" if o.culprit_line is None else f"{o.culprit_line}->{o.got_line} {mark(o.line_ok)}"
        )
        print(
            f"{o.path:{w}} {o.expected:19} {got:48} {mark(o.top1):4} {mark(o.top3):4} "
            f"{line:14} {o.seconds:6.1f}"
        )
        if o.error:
            print(f"{'':{w}} error: {o.error}")


def print_plain_table(outcomes: list[Outcome]) -> None:
    w = max(len(o.path) for o in outcomes)
    for o in outcomes:
        if o.skipped:
            verdict = "FAIL" if o.top1 is False else "skip"
            print(f"{verdict:4}  {o.path:{w}} {o.expected:19} ({o.skipped})")
            continue
        note = f"  [{o.error}]" if o.error else ""
        print(
            f"{mark(o.top1):4}  {o.path:{w}} {o.expected:19} printed {o.status or 'nothing':9} {o.seconds:5.1f} s{note}"
        )


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def print_summary(split: str, summary: dict, targets: dict) -> None:
    print()
    groups = summary.get("top1_by_group") or {}
    print("top-1 by group   " + ", ".join(f"{g} {h}/{n}" for g, (h, n) in groups.items()))
    print(f"{split} split: scripts {summary['scripts']} (buggy {summary['buggy']}, "
          f"healthy {summary['healthy']}, skipped {summary['skipped']})")  # fmt: skip
    print(f"top-1 accuracy   {percent(summary['top1'])}   (target >= {percent(targets['top1'])})")
    print(f"top-3 accuracy   {percent(summary['top3'])}   (target >= {percent(targets['top3'])})")
    print(f"line accuracy    {percent(summary['line'])} of {summary['with_line']} with a culprit line"
          f"   (target >= {percent(targets['line'])})")  # fmt: skip
    print(
        f"false alarms     {summary['false_alarms']} of {summary['healthy']} healthy   (target 0)"
    )
    print(f"sick called well {summary['missed']} of {summary['buggy']} buggy   (target 0)")
    print(f"verified top fix {percent(summary['verified'])}   "
          f"(target >= {percent(targets['verified'])})")  # fmt: skip
    if summary["median_s"] is not None:
        print(f"seconds/script   median {summary['median_s']:.1f}, max {summary['max_s']:.1f}"
              f"   (target median < {targets['median_s']:.0f})")  # fmt: skip


def select(entries: list[Entry], only: str | None) -> list[Entry]:
    if not only:
        return entries
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    return [
        e for e in entries if any(w in (e.category, e.path) or e.path.startswith(w) for w in wanted)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile", default="standard", help="nandoctor profile (default: standard)"
    )
    parser.add_argument("--split", choices=("dev", "test", "all"), default="all",
                        help="which labelled split to run (default: both)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="scripts run at the same time")
    parser.add_argument("--only", help="comma-separated categories, paths or path prefixes")
    parser.add_argument("--plain", action="store_true", help="check the labels with plain python")
    parser.add_argument("--json", type=Path, help="write the per-script results and summary here")
    parser.add_argument(
        "--reports", type=Path, help="keep every script's JSON report in this folder"
    )
    args = parser.parse_args(argv)

    splits = ("dev", "test") if args.split == "all" else (args.split,)
    entries = select([e for split in splits for e in load_manifest(split)], args.only)
    if not entries:
        parser.error(f"--only {args.only!r} matches no script")
    has_cuda = cuda_available()
    if args.reports is not None:
        args.reports.mkdir(parents=True, exist_ok=True)

    def run_one(entry: Entry) -> Outcome:
        reason = skip_reason(entry, has_cuda)
        if reason and args.plain:
            # What can be checked without the hardware: the script trains normally on the CPU.
            outcome = run_plain(entry, expect_nonfinite=False)
            verdict = "finite on the CPU as expected" if outcome.top1 else "NOT finite on the CPU"
            outcome.skipped = f"{reason}; {verdict}"
            return outcome
        if reason:
            return Outcome(
                entry.path, entry.category, skipped=reason, culprit_line=entry.culprit_line
            )
        if args.plain:
            outcome = run_plain(entry, expect_nonfinite=not entry.healthy)
        else:
            outcome = run_nandoctor(entry, args.profile, args.reports)
        print(f"  {mark(outcome.top1):4} {entry.path} ({outcome.seconds:.1f} s)", file=sys.stderr)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(run_one, entries))

    if args.plain:
        print_plain_table(outcomes)
        ran = [o for o in outcomes if o.skipped is None]
        failures = [o for o in outcomes if o.top1 is False]
        print(f"\n{sum(bool(o.top1) for o in ran)} of {len(ran)} scripts behave as labelled under "
              f"plain python; {len(outcomes) - len(ran)} need hardware this machine lacks")  # fmt: skip
        ok = not failures
        summary = {"plain": True, "scripts": len(outcomes), "skipped": len(outcomes) - len(ran),
                   "failures": [o.path for o in failures]}  # fmt: skip
    else:
        print_table(outcomes)
        summary, ok = {}, True
        for split in splits:
            chosen = [e for e in entries if e.split == split]
            if not chosen:
                continue
            paths = {e.path for e in chosen}
            summary[split] = summarize([o for o in outcomes if o.path in paths], chosen)
            print_summary(split, summary[split], TARGETS[split])
            met = targets_met(summary[split], TARGETS[split])
            ok = ok and met
            print(f"{split} targets {'met' if met else 'NOT met'}")
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "results": [asdict(o) for o in outcomes]}, indent=2)
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
