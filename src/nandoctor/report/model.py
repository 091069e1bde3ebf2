"""Report data model: frozen dataclasses of plain values (never tensors), ranked deterministically."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

CATEGORIES = (
    "data",
    "learning_rate",
    "initialization",
    "invalid_operation",
    "exploding_gradients",
    "precision",
    "device",
    "optimizer_config",
)
PHASES = ("data", "forward", "backward", "optimizer")


def display_path(path: str) -> str:
    if os.path.isabs(path):
        relative = os.path.relpath(path)
        return path if relative.startswith("..") else relative
    return path


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    function: str | None = None
    code: str | None = None

    @classmethod
    def from_dict(cls, data: dict | None) -> Location | None:
        if not data or not data.get("file") or not data.get("line"):
            return None
        return cls(data["file"], int(data["line"]), data.get("function"), data.get("code"))

    def short(self) -> str:
        """`file:line` with the file relative to the working directory when it is below it."""
        return f"{display_path(self.file)}:{self.line}"


@dataclass(frozen=True)
class FirstNonfinite:
    """The op where the NaN/Inf that mattered was born."""

    step: int
    phase: str
    op: str
    module: str | None
    location: Location | None
    explanation: str
    reached: str = ""  # "the loss", "the gradient of fc1.weight", ...
    target: str = ""  # what it reached, as a stable word: loss | gradient | parameter | read
    nonfinite: str = ""  # "nan=3, +inf=1 of 64"
    backward_node: str | None = None
    rank: int | None = None  # of a torchrun launch: the rank where it happened first
    # What happened, as a stable kind (instrument/explain.py: domain, overflow, ...), the dtype
    # the op computed in, and for a backward op the forward op whose gradient it is.
    kind: str = "unknown"
    dtype: str | None = None
    forward_op: str | None = None
    facts: dict = field(default_factory=dict)  # counts on the op's inputs: {"zero": 3, ...}


@dataclass(frozen=True)
class Finding:
    """A stage's claim with its evidence; causes are ranked from findings."""

    stage: str
    category: str
    title: str
    confidence: float
    evidence: tuple[str, ...]
    fix: str
    location: Location | None = None
    severity: str = "error"  # error | warning | hint; hints never become causes
    verified_fix: bool | None = None
    # A fix nandoctor can apply to a re-run by itself, to verify it (instrument/remedies.py).
    remedy: dict | None = None
    code: str = ""  # the stable id of this kind of claim (codes.py)
    # How far the loss fell, as a fraction of where it started, in the run that showed the
    # fix works (the verifying re-run; for a learning rate, the largest smaller rate that
    # trains), counted from step 0 in both: what a fix that only hides a symptom lacks.
    progress: float | None = None


@dataclass(frozen=True)
class Cause:
    rank: int
    category: str
    title: str
    confidence: float
    evidence: tuple[str, ...]
    fix: str
    location: Location | None
    verified_fix: bool | None = None
    stage: str = ""
    code: str = ""


@dataclass
class StageResult:
    status: str  # ran | skipped | failed
    summary: str = ""
    duration_s: float | None = None
    details: dict = field(default_factory=dict)  # stage-specific fields of the JSON report


@dataclass
class Report:
    script_path: str
    script_args: list[str]
    status: str  # healthy | nonfinite | inconclusive | script_error | timeout
    first_nonfinite: FirstNonfinite | None
    causes: list[Cause]
    stages: dict[str, StageResult]
    environment: dict
    run: dict = field(default_factory=dict)  # what the watched run saw: steps, losses, errors
    findings: list[Finding] = field(default_factory=list)  # all findings, hints included
