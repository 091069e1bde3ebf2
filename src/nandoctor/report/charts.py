"""Charts for the shareable reports: self-contained SVG (HTML) and mermaid (Markdown)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


@dataclass(frozen=True)
class Series:
    label: str
    values: tuple[float | None, ...]  # None or non-finite: a gap (the value was NaN/Inf)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _wants_log_scale(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and bool(values) and max(values) / min(values) > 100


def line_chart_svg(
    series: list[Series],
    *,
    title: str,
    y_label: str,
    x_label: str = "step",
    marker: int | None = None,
    marker_label: str = "first NaN/Inf",
    width: int = 640,
    height: int = 240,
) -> str:
    """A line chart with one polyline per series; a dashed red line marks `marker` on x."""
    values = [v for s in series for v in s.values if _finite(v)]
    longest = max((len(s.values) for s in series), default=0)
    if not values or longest == 0:
        return ""
    log = _wants_log_scale(values)
    scale = (lambda v: math.log10(v)) if log else (lambda v: v)
    low, high = min(map(scale, values)), max(map(scale, values))
    high = high if high > low else low + 1.0
    left, right, top, bottom = 56, 12, 28, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    x_max = max(longest - 1, marker or 0, 1)

    def x_of(i: float) -> float:
        return left + plot_w * i / x_max

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (scale(v) - low) / (high - low))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
        _axis_labels(low, high, log, left, top, plot_h, x_max, plot_w, height, x_label, y_label),
    ]
    for index, s in enumerate(series):
        parts += _polylines(s, _COLORS[index % len(_COLORS)], x_of, y_of)
    if marker is not None:
        x = x_of(marker)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#d62728" '
            f'stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="{top + 12}" font-size="11" '
            f'fill="#d62728">{html.escape(marker_label)} (step {marker})</text>'
        )
    if len(series) > 1:
        parts.append(_legend(series, left, width))
    parts.append("</svg>")
    return "".join(parts)


def _polylines(s: Series, color: str, x_of, y_of) -> list[str]:
    """One polyline per finite run of values: NaN/Inf leave a gap."""
    lines, points = [], []
    for i, v in enumerate([*s.values, None]):
        if _finite(v):
            points.append(f"{x_of(i):.1f},{y_of(v):.1f}")
            continue
        if len(points) == 1:
            x, y = points[0].split(",")
            lines.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
        elif points:
            lines.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{" ".join(points)}"/>'
            )
        points = []
    return lines


def _axis_labels(low, high, log, left, top, plot_h, x_max, plot_w, height, x_label, y_label):
    def label(value: float) -> str:
        return f"{10**value:.3g}" if log else f"{value:.3g}"

    return (
        f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">{label(high)}</text>'
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="10" text-anchor="end">{label(low)}</text>'
        f'<text x="{left}" y="{height - 18}" font-size="10">0</text>'
        f'<text x="{left + plot_w}" y="{height - 18}" font-size="10" text-anchor="end">{x_max}</text>'
        f'<text x="{left + plot_w / 2}" y="{height - 4}" font-size="11" text-anchor="middle">'
        f"{html.escape(x_label)}</text>"
        f'<text x="12" y="{top + plot_h / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + plot_h / 2})">'
        f"{html.escape(y_label + (' (log)' if log else ''))}</text>"
    )


def _legend(series: list[Series], left: int, width: int) -> str:
    items, x = [], left + 150
    for index, s in enumerate(series[:8]):
        color = _COLORS[index % len(_COLORS)]
        items.append(
            f'<rect x="{x}" y="8" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 13}" y="17" font-size="10">{html.escape(s.label)}</text>'
        )
        x += 14 + 7 * len(s.label) + 10
        if x > width - 40:
            break
    return "".join(items)


def line_chart_mermaid(series: list[Series], *, title: str, y_label: str) -> str:
    """A mermaid `xychart-beta` block (GitHub renders it): finite prefixes only."""
    drawable = []
    for s in series:
        prefix = []
        for v in s.values:
            if not _finite(v):
                break
            prefix.append(v)
        if prefix:
            drawable.append(prefix)
    if not drawable:
        return ""
    longest = max(len(p) for p in drawable)
    lines = [
        "```mermaid",
        "xychart-beta",
        f'    title "{title}"',
        f'    x-axis "step" 0 --> {max(longest - 1, 1)}',
        f'    y-axis "{y_label}"',
    ]
    lines += [f"    line [{', '.join(f'{v:.4g}' for v in values)}]" for values in drawable]
    lines.append("```")
    return "\n".join(lines)
