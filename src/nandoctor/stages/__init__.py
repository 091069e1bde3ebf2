"""The stages of the checklist, one module each.

A stage module has:
- `NAME`, and `run(context: StageContext) -> StageOutcome` (parent side, plain data only);
- optionally `install_probe(session, options)`, run inside the watched child process to look
  at batches or modules while the script trains (the probe emits events the stage reads back);
- optionally `PROBE = True` so the watched run installs that probe.
Stage modules import torch only inside functions that run in the child.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nandoctor.config import Config
from nandoctor.report.model import Finding, StageResult
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
