"""Wording shared by every renderer (terminal, Markdown, HTML)."""

from __future__ import annotations

from nandoctor.distributed import describe_rank
from nandoctor.report.model import Location, Report

VERDICTS = {
    "healthy": "healthy: no NaN/Inf reached the loss, a gradient or a parameter",
    "nonfinite": "NaN/Inf found",
    "inconclusive": "inconclusive: no NaN/Inf so far, but the script was stopped before it ended",
    "script_error": "the script failed before any NaN/Inf was seen",
    "timeout": "the script hit the time limit",
}


def verdict_line(report: Report) -> str:
    verdict = VERDICTS[report.status]
    first = report.first_nonfinite
    if first is not None:
        verdict += f": {first.op} in {first.phase} at step {first.step}"
        if first.rank is not None:
            verdict += f" on rank {first.rank} of {len(report.run.get('ranks', []))}"
    error = report.run.get("script_error")
    if error and report.status == "nonfinite":
        verdict += f", then the script raised {error.get('type')}"
    elif error and (diverged := report.run.get("diverged")):
        verdict = (
            f"the script raised {error.get('type')} after its loss diverged: {diverged['evidence']}"
        )
    elif error:
        verdict = f"the script raised {error.get('type')} before any NaN/Inf was seen"
    if report.status == "inconclusive" and (budget := report.run.get("budget")):
        verdict = (
            f"inconclusive: no NaN/Inf in {budget['steps']} optimizer steps, but the "
            f"--max-steps budget stopped the script before it ended; raise it or drop it to "
            "watch the whole run"
        )
    return verdict


def rank_lines(report: Report) -> list[str]:
    """What each rank of a torchrun launch saw, one line each; none for a single process."""
    return [describe_rank(summary) for summary in report.run.get("ranks", [])]


def where(location: Location | None) -> str:
    if location is None:
        return "(no user line)"
    function = f" in {location.function}" if location.function else ""
    return f"{location.short()}{function}"


def code_language(location: Location) -> str:
    return "python" if location.file.endswith(".py") else ""


def stage_rows(report: Report) -> list[tuple[str, str, str, str]]:
    return [
        (name, stage.status, f"{stage.duration_s:.1f}s" if stage.duration_s is not None else "",
         stage.summary)
        for name, stage in report.stages.items()
    ]  # fmt: skip
