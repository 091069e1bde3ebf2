"""`nandoctor explain [CATEGORY | CODE]`: what a cause or a finding's code means, the evidence
it stands on, its record on the labelled corpus, and the usual fixes."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nandoctor.categories import GUIDES, CategoryGuide
from nandoctor.cli_common import fail_usage
from nandoctor.codes import CODES, PRIOR_WEIGHT, Code, record
from nandoctor.errors import UsageError


def register(app) -> None:
    app.command(name="explain")(explain)


def explain(
    topic: Annotated[
        str | None,
        typer.Argument(
            metavar="[CATEGORY|CODE]",
            help=f"A category ({', '.join(GUIDES)}) or a finding's code (IO105, LR501, ...). "
            "Without one: every code.",
        ),
    ] = None,
) -> None:
    """Explain a root-cause category or a finding's code: what it means, the evidence it needs,
    how often it was right on the labelled corpus, and the usual fixes."""
    console = Console()
    if topic is None:
        console.print(_code_table(CODES.values()))
        return
    code = CODES.get(topic.strip().upper())
    if code is not None:
        _print_code(console, code)
        return
    guide = GUIDES.get(topic.strip().lower().replace("-", "_"))
    if guide is None:
        fail_usage(
            UsageError(
                f"unknown category or code {topic!r}: choose a category ({', '.join(GUIDES)}) "
                "or a code (`nandoctor explain` lists them)"
            )
        )
    _print_guide(console, guide)


def _print_code(console: Console, code: Code) -> None:
    console.print(Text(f"{code.code}  {code.claim}", style="bold"))
    console.print(f"category {code.category}, made by the {code.stage} stage")
    console.print(Text("\nevidence it needs", style="bold"))
    console.print(code.evidence)
    console.print(Text("\nrecord on the corpus's dev split", style="bold"))
    console.print(_record_text(code.code))
    if code.fixtures:
        console.print(Text("\nfixture scripts (tests/scripts)", style="bold"))
        for fixture in code.fixtures:
            console.print(f" - {fixture}")
    console.print(
        Text(f"\nabout {code.category}: ", style="bold") + Text(GUIDES[code.category].summary)
    )
    for fix in GUIDES[code.category].fixes:
        console.print(Text(f" - {fix}"))


def _record_text(code: str) -> str:
    seen = record(code)
    if not seen or not seen["seen"]:
        return "not seen on the dev split: its confidence is the finding's own prior"
    return (
        f"right {seen['right']} of {seen['seen']} times it was made as a cause "
        f"(its confidence is the finding's prior moved towards that rate, the prior counting as "
        f"{PRIOR_WEIGHT:g} observations)"
    )


def _print_guide(console: Console, guide: CategoryGuide) -> None:
    console.print(Text(guide.name, style="bold"))
    console.print(guide.summary)
    console.print(Text("\nwhy it produces NaN/Inf", style="bold"))
    console.print(guide.why)
    console.print(Text("\nhow it shows", style="bold"))
    for sign in guide.signs:
        console.print(f" - {sign}")
    console.print(Text("\nusual fixes", style="bold"))
    for fix in guide.fixes:
        console.print(Text(f" - {fix}"))
    console.print(Text("\nfindings of this category", style="bold"))
    console.print(_code_table(c for c in CODES.values() if c.category == guide.name))


def _code_table(codes) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("code")
    table.add_column("category")
    table.add_column("stage")
    table.add_column("claim", overflow="fold")
    table.add_column("dev record", justify="right")
    for code in codes:
        seen = record(code.code)
        rate = f"{seen['right']}/{seen['seen']}" if seen and seen["seen"] else "-"
        table.add_row(code.code, code.category, code.stage, code.claim, rate)
    return table
