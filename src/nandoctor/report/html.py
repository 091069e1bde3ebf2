"""The HTML report: one self-contained file (inline CSS and SVG charts, no network needed)."""

from __future__ import annotations

from html import escape

from nandoctor.report.charts import line_chart_svg
from nandoctor.report.figures import figures
from nandoctor.report.model import Cause, FirstNonfinite, Report
from nandoctor.report.text import rank_lines, stage_rows, verdict_line, where

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.verdict { font-weight: bold; padding: .6rem .8rem; border-radius: 6px; }
.healthy { background: #e6f4ea; color: #1e7b34; } .nonfinite { background: #fde8e8; color: #b42318; }
.script_error, .timeout, .inconclusive { background: #fff4e5; color: #8a5300; }
table { border-collapse: collapse; margin: .5rem 0; } td, th { padding: .25rem .6rem;
        border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
code, pre { font-family: ui-monospace, monospace; background: #f5f5f5; border-radius: 4px; }
pre { padding: .6rem; overflow-x: auto; } .cause { border-left: 4px solid #b42318;
        padding: .2rem .8rem; margin: 1rem 0; } .fix { color: #1e7b34; }
.muted { color: #777; font-size: .85rem; } figure { margin: 1rem 0; }
"""


def _first(first: FirstNonfinite) -> str:
    rows = [
        ("where", f"<code>{escape(where(first.location))}</code>"),
        ("op", f"<code>{escape(first.op)}</code>"
               + (f" ({escape(first.backward_node)})" if first.backward_node else "")),
        ("module", f"<code>{escape(first.module or '-')}</code>"),
        ("phase", f"{escape(first.phase)}, step {first.step}"),
        ("why", escape(first.explanation)),
        ("reached", escape(first.reached)),
    ]  # fmt: skip
    code = ""
    if first.location and first.location.code:
        code = f"<pre>{escape(first.location.code)}</pre>"
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<h2>First non-finite value</h2><table>{body}</table>{code}"


def _cause(cause: Cause) -> str:
    verified = {True: " · fix verified", False: " · fix tried, not enough", None: ""}
    at = f" · at <code>{escape(where(cause.location))}</code>" if cause.location else ""
    evidence = "".join(f"<li>{escape(line)}</li>" for line in cause.evidence)
    return (
        f'<div class="cause"><h3>{cause.rank}. <code>{escape(cause.category)}</code> '
        f"{escape(cause.code)} — "
        f'{escape(cause.title)}</h3><div class="muted">confidence {cause.confidence:.2f}'
        f"{verified[cause.verified_fix]}{at}</div><ul>{evidence}</ul>"
        f'<p class="fix"><b>Fix:</b> {escape(cause.fix)}</p></div>'
    )


def render_html(report: Report) -> str:
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>nandoctor: {escape(report.script_path)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>nandoctor report: <code>{escape(report.script_path)}</code></h1>",
        f'<p class="verdict {report.status}">{escape(verdict_line(report))}</p>',
    ]
    if ranks := rank_lines(report):
        items = "".join(f"<li>{escape(line)}</li>" for line in ranks)
        parts.append(f"<h2>Ranks</h2><ul>{items}</ul>")
    if report.first_nonfinite is not None:
        parts.append(_first(report.first_nonfinite))
    if report.causes:
        parts.append("<h2>Causes, most likely first</h2>")
        parts += [_cause(c) for c in report.causes]
    charts = [
        line_chart_svg(list(f.series), title=f.title, y_label=f.y_label, x_label=f.x_label,
                       marker=f.marker)
        for f in figures(report)
    ]  # fmt: skip
    if any(charts):
        parts.append("<h2>Charts</h2>")
        parts += [f"<figure>{chart}</figure>" for chart in charts if chart]
    rows = "".join(
        f"<tr><td>{escape(n)}</td><td>{escape(s)}</td><td>{escape(t)}</td><td>{escape(m)}</td></tr>"
        for n, s, t, m in stage_rows(report)
    )
    parts.append(f"<h2>Stages</h2><table><tr><th>stage</th><th>status</th><th>time</th>"
                 f"<th>summary</th></tr>{rows}</table>")  # fmt: skip
    env = report.environment
    parts.append(
        f'<p class="muted">nandoctor {escape(str(env.get("nandoctor")))} · torch '
        f"{escape(str(env.get('torch')))} · python {escape(str(env.get('python')))}</p>"
    )
    parts.append("</body></html>\n")
    return "".join(parts)
