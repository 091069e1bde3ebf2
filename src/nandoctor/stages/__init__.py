"""The stages of the checklist, one module each.

A stage module has:
- `NAME`, and `run(context: StageContext) -> StageOutcome` (parent side, plain data only);
- optionally `install_probe(session, options)`, run inside the watched child process to look
  at batches or modules while the script trains (the probe emits events the stage reads back);
- optionally `PROBE = True` so the watched run installs that probe;
- optionally `render_details(result: StageResult, console)` to print its own table/curves;
- `Settings`, a frozen dataclass: the stage's section of a profile (configs/*.yaml).
Stage modules import torch only inside functions that run in the child.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nandoctor.report.model import Finding, StageResult

if TYPE_CHECKING:  # config imports every stage's Settings; stages only need the type
    from nandoctor.config import Config
    from nandoctor.runner import RunOutcome
    from nandoctor.target import Target


@dataclass
class StageOutcome:
    result: StageResult
    findings: list[Finding] = field(default_factory=list)
    first_nonfinite: object | None = None  # the anomaly stage's FirstNonfinite


@dataclass
class StageContext:
    target: Target
    config: Config
    workdir: str  # scratch space of this diagnosis, removed afterwards
    watch: RunOutcome  # the watched run every stage starts from
    earlier: dict[str, StageOutcome] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda text: None  # one-line status for the terminal
