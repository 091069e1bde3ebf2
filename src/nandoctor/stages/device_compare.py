"""device_compare stage (being built): reports itself as skipped until it exists."""

from __future__ import annotations

from dataclasses import dataclass

from nandoctor.report.model import StageResult
from nandoctor.stages import StageContext, StageOutcome

NAME = "device_compare"


@dataclass(frozen=True)
class Settings:
    """Settings of this stage (the `device_compare:` section of a profile)."""


def run(context: StageContext) -> StageOutcome:
    return StageOutcome(StageResult("skipped", "not available in this version"))
