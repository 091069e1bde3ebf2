"""`nandoctor explain CATEGORY`: what a cause means, why it makes NaN/Inf, the usual fixes."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from nandoctor.categories import GUIDES
from nandoctor.cli_common import fail_usage
from nandoctor.errors import UsageError


def register(app) -> None:
    app.command(name="explain")(explain)


def explain(
    category: Annotated[str, typer.Argument(help=f"One of: {', '.join(GUIDES)}.")],
) -> None:
    """Explain a root-cause category: what it means, why it produces NaN/Inf, usual fixes."""
    guide = GUIDES.get(category.strip().lower().replace("-", "_"))
    if guide is None:
        fail_usage(UsageError(f"unknown category {category!r}: choose one of {', '.join(GUIDES)}"))
    console = Console()
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
