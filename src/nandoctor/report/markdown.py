"""The Markdown report: paste it into an issue (GitHub renders the mermaid charts)."""

from __future__ import annotations

from nandoctor.report.charts import line_chart_mermaid
from nandoctor.report.figures import figures
from nandoctor.report.model import Cause, Report
from nandoctor.report.text import (
    VERDICTS,
    code_language,
    rank_lines,
    stage_rows,
    verdict_line,
    where,
)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cause(cause: Cause) -> list[str]:
    verified = {True: " — fix verified", False: " — fix tried, not enough", None: ""}
    lines = [
        f"### {cause.rank}. `{cause.category}` {cause.code} — {cause.title}",
        f"confidence {cause.confidence:.2f}{verified[cause.verified_fix]}"
        + (f" · at `{where(cause.location)}`" if cause.location else ""),
        "",
    ]
    lines += [f"- {line}" for line in cause.evidence]
    lines += ["", f"**Fix:** {cause.fix}", ""]
    return lines


def render_markdown(report: Report) -> str:
    lines = [f"# nandoctor report: `{report.script_path}`", "", f"**{verdict_line(report)}**", ""]
    if ranks := rank_lines(report):
        lines += ["## Ranks", "", *[f"- {_cell(line)}" for line in ranks], ""]
    first = report.first_nonfinite
    if first is not None:
        lines += ["## First non-finite value", "", "| | |", "|---|---|"]
        lines += [
            f"| where | `{_cell(where(first.location))}` |",
            f"| op | `{first.op}`{' (' + first.backward_node + ')' if first.backward_node else ''} |",
            f"| module | `{first.module or '-'}` |",
            f"| phase | {first.phase}, step {first.step} |",
            f"| why | {_cell(first.explanation)} |",
            f"| reached | {_cell(first.reached)} |",
            "",
        ]
        if first.location and first.location.code:
            lines += [f"```{code_language(first.location)}", first.location.code, "```", ""]
    if report.causes:
        lines += ["## Causes, most likely first", ""]
        for cause in report.causes:
            lines += _cause(cause)
    elif report.status in ("healthy", "inconclusive"):
        lines += [f"{VERDICTS[report.status]}. No cause.", ""]
    charts = [line_chart_mermaid(list(f.series), title=f.title, y_label=f.y_label)
              for f in figures(report)]  # fmt: skip
    if any(charts):
        lines += ["## Charts", ""] + [c + "\n" for c in charts if c]
    lines += ["## Stages", "", "| stage | status | time | summary |", "|---|---|---|---|"]
    lines += [f"| {name} | {status} | {seconds} | {_cell(summary)} |"
              for name, status, seconds, summary in stage_rows(report)]  # fmt: skip
    env = report.environment
    lines += ["", f"<sub>nandoctor {env.get('nandoctor')} · torch {env.get('torch')} · "
              f"python {env.get('python')}</sub>", ""]  # fmt: skip
    return "\n".join(lines)
