"""What the shareable reports chart, independent of how (SVG for HTML, mermaid for Markdown)."""

from __future__ import annotations

from dataclasses import dataclass

from nandoctor.report.charts import Series
from nandoctor.report.model import Report


@dataclass(frozen=True)
class Figure:
    title: str
    y_label: str
    series: tuple[Series, ...]
    marker: int | None = None  # the step of the first NaN/Inf
    x_label: str = "step"


def _values(values) -> tuple[float | None, ...]:
    return tuple(v if isinstance(v, (int, float)) else None for v in values or [])


def figures(report: Report) -> list[Figure]:
    marker = report.first_nonfinite.step if report.first_nonfinite else None
    found = []
    for key, title, label in (
        ("losses", "loss per optimizer step", "loss"),
        ("grad_norms", "gradient norm per optimizer step", "‖grad‖"),
    ):
        values = _values(report.run.get(key))
        if any(v is not None for v in values):
            found.append(Figure(title, label, (Series(label, values),), marker))
    found += _sweep_figures(report)
    found += _init_figures(report)
    return found


def _sweep_figures(report: Report) -> list[Figure]:
    sweep = report.stages.get("lr_sweep")
    runs = (sweep.details.get("runs") or []) if sweep else []
    series = tuple(
        Series(f"lr x{run['multiplier']:g} ({run.get('verdict', '?')})", _values(run["losses"]))
        for run in runs
        if run.get("losses")
    )
    return [Figure("learning-rate sweep: loss per run", "loss", series)] if series else []


def _init_figures(report: Report) -> list[Figure]:
    init = report.stages.get("init_check")
    layers = (init.details.get("activations") or []) if init else []
    values = _values([layer.get("std") for layer in layers])
    if not any(v is not None for v in values):
        return []
    series = (Series("activation std", values),)
    return [Figure("activation scale at init, by module in execution order", "std", series,
                   x_label="module (execution order)")]  # fmt: skip
