"""init_check stage (being built): reports itself as skipped until it exists."""

from __future__ import annotations

from dataclasses import dataclass

from nandoctor.report.model import StageResult
from nandoctor.stages import StageContext, StageOutcome

NAME = "init_check"


@dataclass(frozen=True)
class Settings:
    """Settings of this stage (the `init_check:` section of a profile)."""


def run(context: StageContext) -> StageOutcome:
    return StageOutcome(StageResult("skipped", "not available in this version"))
