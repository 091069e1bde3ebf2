"""The sweep in the terminal: one row per run with a small loss curve, then the answer."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from nandoctor.report.model import Location, StageResult
from nandoctor.stages.lr_sweep.conclusions import (
    INSENSITIVE,
    LEARNING_RATE,
    NONE_STABLE,
    NOT_IMPLICATED,
    label,
)

_BLOCKS = "▁▂▃▄▅▆▇█"
_VERDICT_STYLE = {"diverged": "bold red", "unstable": "yellow", "stable": "green", "error": "dim"}
_CURVE_WIDTH = 24
_WIDE = 120  # below this console width the reasons go under the table instead of a column


def sparkline(values: list[float], ended_nonfinite: bool = False) -> Text:
    """A loss curve in block characters (log scale when it spans decades); ✗ marks NaN/Inf."""
    series = [v for v in values if v is not None and math.isfinite(v)]
    if len(series) > _CURVE_WIDTH:
        size = len(series) / _CURVE_WIDTH
        series = [series[int(i * size)] for i in range(_CURVE_WIDTH)]
    if series and min(series) > 0 and max(series) / min(series) > 20:
        series = [math.log10(v) for v in series]
    text = Text()
    if series:
        low, high = min(series), max(series)
        span = (high - low) or 1.0
        text.append(
            "".join(_BLOCKS[min(7, int((v - low) / span * 8))] for v in series), style="cyan"
        )
    if ended_nonfinite:
        text.append("✗", style="bold red")
    return text


def _number(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _run_name(run: dict) -> str:
    name = run.get("label", f"{run['multiplier']:.3g}")
    if run.get("clip") is not None:
        return name + f" +clip {run['clip']:g}"
    if alone := run.get("only_optimizers_at"):
        return name + f" (line {alone['line']} only)"
    return name + (" (watched)" if run.get("purpose") == "watched" else "")


def _why(run: dict) -> str:
    why = run.get("detail", "")
    return why + (f"; {run['warning']}" if run.get("warning") else "")


def _table(details: dict, wide: bool) -> Table:
    title = f"learning-rate sweep: horizon {details.get('horizon')} steps"
    if details.get("jobs"):
        title += f", {details['jobs']} at once"
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    columns = ["×lr", "peak lr", "steps", "NaN/Inf at", "final loss", "verdict", "loss curve"]
    for name in columns + (["why"] if wide else []):
        left = name in ("verdict", "loss curve", "why")
        table.add_column(name, justify="left" if left else "right",
                         overflow="fold" if name == "why" else "ellipsis",
                         no_wrap=name != "why")  # fmt: skip
    for run in details.get("runs", []):
        cells = [
            _run_name(run),
            _number(run.get("lr")),
            str(run.get("steps", "")),
            _number(run.get("first_nonfinite_step")),
            _number(run.get("final_loss")),
            Text(run["verdict"], style=_VERDICT_STYLE.get(run["verdict"], "")),
            sparkline(run.get("losses", []), run.get("first_nonfinite_step") is not None),
        ]
        table.add_row(*cells, *([_why(run)] if wide else []))
    return table


def _answer(details: dict) -> list[Text]:
    lines = []
    conclusion = details.get("conclusion")
    multiplier = details.get("recommended_lr_multiplier")
    if conclusion == LEARNING_RATE and multiplier is not None:
        check = "verified by a stable run" if details.get("verified") else "not verified"
        lines.append(Text.assemble(("recommended: ", "bold green"), f"×{label(multiplier)}  ",
                                   (f"({check})", "dim")))  # fmt: skip
        for opt in details.get("recommended_lrs", []):
            loc = Location.from_dict(opt.get("location"))
            where = f" at {loc.short()}" if loc else ""
            lrs = ", ".join(_number(lr) for lr in opt.get("lrs", []))
            what = "peak lr" if opt.get("peak") else "lr"
            lines.append(Text(f"   {opt.get('optimizer')}{where}: {what} {lrs}"))
    elif conclusion == INSENSITIVE:
        text = (
            "the learning rate is not the cause: every multiplier fails at about the same "
            "step; look at the other stages' evidence"
        )
        lines.append(Text(text, style="yellow"))
    elif conclusion == NONE_STABLE:
        lines.append(Text("no multiplier in the sweep trained stably", style="yellow"))
    stopped = details.get("stopped_early") or []
    if stopped:
        names = ", ".join(f"×{label(s['multiplier'])}" for s in stopped)
        lines.append(Text(f"stopped early (could no longer change the answer): {names}",
                          style="dim"))  # fmt: skip
    return lines


def render_details(result: StageResult, console: Console) -> None:
    details = result.details
    if not details.get("runs") or details.get("conclusion") == NOT_IMPLICATED:
        return  # the stage's summary line says it all
    wide = console.width >= _WIDE
    console.print(_table(details, wide))
    if not wide:
        for run in details["runs"]:
            console.print(Text(f"   ×{_run_name(run)}: {_why(run)}", style="dim"))
    for line in _answer(details):
        console.print(line)
