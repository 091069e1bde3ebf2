"""The device comparison in the terminal: reference, first divergence, worst ops, losses."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

from nandoctor.report.model import StageResult, display_path


def _number(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _place(record: dict) -> str:
    location = record.get("location")
    return f"{display_path(location['file'])}:{location['line']}" if location else "-"


def _short_place(record: dict) -> str:
    location = record.get("location")
    return f"{os.path.basename(location['file'])}:{location['line']}" if location else "-"


def _short_op(op: str) -> str:
    """`aten.exp.default` -> `exp`; `aten.sum.dim_IntList` -> `sum.dim_IntList`."""
    return op.removeprefix("aten.").removesuffix(".default")


def render_details(result: StageResult, console: Console) -> None:
    details = result.details
    if compiled := details.get("compiled_vs_eager"):
        console.print(
            Text.assemble(
                ("compiled vs eager  ", "bold"),
                ("(the eager run: torch.compile disabled, same seed)", "dim"),
            )
        )
        console.print(compiled["verdict"])
        console.print(_loss_table(details["loss_trajectories"], "losses"))
    if details.get("reference"):
        _render_shadow(details, console)


def _render_shadow(details: dict, console: Console) -> None:
    console.print(
        Text.assemble(
            ("device comparison  ", "bold"),
            f"target {details.get('target')} vs reference {details.get('reference')}",
            (f"  ({details.get('reference_reason')})", "dim"),
        )
    )
    first = details.get("first_divergence")
    if first is None:
        console.print(Text("no op differed beyond tolerance", style="green"))
    else:
        console.print(_first_divergence(first))
    if first is not None and details.get("worst_ops"):  # all within tolerance: no table to read
        console.print(_worst_table(details["worst_ops"]))
    if details.get("run_comparison"):
        verdict = details["run_comparison"]["verdict"]
        console.print(_loss_table(details["loss_trajectories"], f"losses: {verdict}"))


def _first_divergence(first: dict) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("first divergence", f"{first['op']} at {_place(first)}")
    location = first.get("location") or {}
    if location.get("code"):
        table.add_row("", Text(location["code"], style="cyan"))
    table.add_row("phase", f"{first.get('phase') or first.get('during')}, step {first.get('step')}")
    table.add_row("module", first.get("module") or "-")
    if first.get("nonfinite_only_on"):
        table.add_row("non-finite", f"only on the {first['nonfinite_only_on']}: "
                      f"{first.get('target_nonfinite') or '-'}")  # fmt: skip
    if first.get("reference_max") is not None:
        table.add_row("reference", f"{first.get('reference')}: max |x| = "
                      f"{first['reference_max']:.4g}")  # fmt: skip
    table.add_row("error", f"max abs {_number(first.get('max_abs_err'))}, max rel "
                  f"{_number(first.get('max_rel_err'))}")  # fmt: skip
    if first.get("explanation"):
        table.add_row("why", first["explanation"])
    if drift := first.get("drift_from"):
        table.add_row("rounding began", f"{drift['op']} at {_place(drift)}")
    return table


def _worst_table(worst: list[dict]) -> Table:
    table = Table(title="largest differences", title_justify="left", show_edge=False)
    for column in ("op", "step", "phase", "where", "abs err", "rel err", "x tol",
                   "NaN/Inf only on"):  # fmt: skip
        numeric = column in ("abs err", "rel err", "x tol")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=numeric)
    for record in worst:
        table.add_row(
            _short_op(record["op"]),
            str(record["step"]),
            record.get("phase") or record.get("during", "-"),
            _short_place(record),
            _number(record.get("max_abs_err")),
            _number(record.get("max_rel_err")),
            _number(record.get("ratio")),
            record.get("nonfinite_only_on") or "-",
            style="red" if record.get("beyond_tolerance") else "",
        )
    return table


def _loss_table(trajectories: dict, title: str) -> Table:
    sides = list(trajectories)
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("step", justify="right")
    for side in sides:
        table.add_column(side, justify="right")
    for step in range(max(len(v) for v in trajectories.values())):
        row = [trajectories[s][step] if step < len(trajectories[s]) else None for s in sides]
        table.add_row(str(step), *(_number(v) for v in row))
    return table
