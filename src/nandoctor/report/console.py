"""Render a report to the terminal with rich. A pure function of the report and a Console."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from nandoctor.report.model import Cause, FirstNonfinite, Report
from nandoctor.report.text import rank_lines, stage_rows, verdict_line
from nandoctor.report.text import where as _where
from nandoctor.rewind import FROM_THE_START

_VERDICT_STYLE = {
    "healthy": "green",
    "nonfinite": "red",
    "inconclusive": "yellow",
    "script_error": "yellow",
    "timeout": "yellow",
}
_STAGE_STYLE = {"ran": "green", "skipped": "dim", "failed": "red"}


def _first_panel(first: FirstNonfinite) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("where", _where(first.location))
    if first.location and first.location.code:
        table.add_row("", Text(first.location.code, style="cyan"))
    table.add_row("op", first.op + (f"  ({first.backward_node})" if first.backward_node else ""))
    table.add_row("module", first.module or "-")
    table.add_row("phase", f"{first.phase}, step {first.step}")
    table.add_row("why", first.explanation)
    if first.reached:
        table.add_row("reached", first.reached)
    return Panel(table, title="first non-finite value", title_align="left", border_style="red")


def _cause_block(cause: Cause) -> Group:
    verified: tuple[str, str] = ("", "")
    if cause.verified_fix is True:
        verified = ("  (fix verified)", "green")
    elif cause.verified_fix is False:
        verified = ("  (fix tried, not enough)", "yellow")
    lines = [
        Text.assemble(
            (f"{cause.rank}. {cause.category}", "bold"),
            (f" {cause.code}" if cause.code else "", "dim"),
            f"  {cause.title}  ",
            (f"confidence {cause.confidence:.2f}", "dim"),
            verified,
        )
    ]
    if cause.location:
        lines.append(Text(f"   at {_where(cause.location)}", style="dim"))
    lines += [Text(f"   - {line}") for line in cause.evidence]
    lines.append(Text.assemble(("   fix: ", "bold green"), cause.fix))
    return Group(*lines)


def _stage_table(report: Report) -> Table:
    table = Table(title="stages", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("stage")
    table.add_column("status")
    table.add_column("time", justify="right")
    table.add_column("summary", overflow="fold")
    for name, status, seconds, summary in stage_rows(report):
        style = _STAGE_STYLE.get(status, "")
        table.add_row(name, Text(status, style=style), seconds, Text(summary))
    return table


def _script_problem(report: Report) -> Text | None:
    run = report.run
    if error := run.get("script_error"):
        return Text(error.get("traceback", "").rstrip(), style="yellow")
    if exit_event := run.get("script_exit"):
        return Text(f"the script called sys.exit({exit_event.get('code')})", style="yellow")
    if internal := run.get("internal_error"):
        return Text(f"nandoctor failed to start the run: {internal.get('text')}", style="red")
    if tail := run.get("output_tail"):
        return Text(f"the script's process died ({run.get('ended')}); its last output:\n{tail}")
    return None


def _watched_line(report: Report) -> Text:
    steps = report.run.get("steps_observed", 0)
    backward_calls = report.run.get("backward_calls", 0)
    if steps or report.status == "nonfinite":
        return Text(f"{steps} optimizer step{'s' if steps != 1 else ''} watched", style="dim")
    return Text(
        "no optimizer step was observed (no torch.optim optimizer stepped); "
        f"{backward_calls} backward pass{'es' if backward_calls != 1 else ''} checked",
        style="yellow",
    )


def _reruns_line(report: Report) -> Text | None:
    """Where the re-runs started: `re-runs: replay-from-2999 from step 2758 (rewind point),
    verify-0 from step 0 (...)`."""
    reruns = report.run.get("reruns") or []
    if not reruns:
        return None
    refused = report.run.get("rewind_refused")
    if refused and all(rerun["from_step"] == 0 for rerun in reruns):
        text = f"re-runs: {len(reruns)}, all from step 0 (no rewind point: {refused['reason']})"
        return Text(text, style="dim")
    groups: dict[tuple, int] = {}  # (kind of run, step, how) -> runs; candidates are many
    for rerun in reruns:
        how = "rewind point" if rerun["from_step"] else rerun["why"].removeprefix("from step 0: ")
        kind = rerun["run"].split("-")[0] if rerun["run"].startswith("lr_sweep") else rerun["run"]
        key = (kind, rerun["from_step"], how)
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{kind}{f' ×{count}' if count > 1 else ''} from step {step}"
             + (f" ({how})" if how != FROM_THE_START.why else "")
             for (kind, step, how), count in groups.items()]  # fmt: skip
    return Text("re-runs: " + ", ".join(parts), style="dim")


def render_report(report: Report, console: Console) -> None:
    style, verdict = _VERDICT_STYLE[report.status], verdict_line(report)
    first = report.first_nonfinite
    console.print(Text(f"nandoctor · {report.script_path}", style="bold"))
    console.print(Text(verdict, style=f"bold {style}"))
    console.print(_watched_line(report))
    for line in rank_lines(report):
        console.print(Text(line, style="dim"))
    for note in report.run.get("notes", []):
        console.print(Text(f"note: {note}", style="dim"))
    if (reruns := _reruns_line(report)) is not None:
        console.print(reruns)
    if (problem := _script_problem(report)) is not None:
        console.print(problem)
    if first is not None:
        console.print(_first_panel(first))
    if report.causes:
        console.print(Text("causes, most likely first", style="bold underline"))
        for cause in report.causes:
            console.print(_cause_block(cause))
    elif report.status == "healthy" and report.findings:
        console.print(Text("warnings (not causes: the run stayed finite)", style="bold"))
        for finding in report.findings:
            console.print(
                Text(f" - [{finding.category} {finding.code}] {finding.title}", style="yellow")
            )
    _render_stage_details(report, console)
    console.print(_stage_table(report))


def _render_stage_details(report: Report, console: Console) -> None:
    """Stages that have more to show (sweep table, comparison) render it themselves."""
    import importlib

    for name, result in report.stages.items():
        try:
            module = importlib.import_module(f"nandoctor.stages.{name}")
        except ImportError:
            continue
        render = getattr(module, "render_details", None)
        if render is not None and result.status == "ran":
            render(result, console)
