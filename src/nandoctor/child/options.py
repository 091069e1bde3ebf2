"""What the parent asks of one child run; written to a JSON file the child reads at start."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

# The user's own values of the variables nandoctor sets for the child's interpreter (JSON,
# null for unset): the child restores them before the script starts.
USER_ENVIRONMENT = "NANDOCTOR_USER_ENVIRONMENT"


@dataclass
class ChildOptions:
    script: str
    args: list[str]
    events_path: str
    max_steps: int | None = None  # None: no step budget
    seed: int | None = 0
    threads: int | None = None
    detect: bool = True  # per-op localization (slower) instead of step-level checks only
    detect_from_step: int = 0  # a replay switches per-op localization on at this step only
    probes: list[str] = field(default_factory=list)  # in-child probes of stages: data_scan, ...
    lr_multiplier: float = 1.0
    scratch_dir: str | None = None  # re-runs: files the script writes go here instead
    remedy: dict | None = None  # a fix to apply in this run (instrument/remedies.py)
    extra: dict = field(default_factory=dict)  # stage-specific settings
    nproc_per_node: int = 1  # > 1: torchrun launches that many ranks, each writes its events
    rank_grace_s: float = 10.0  # the other ranks' time to stop once one has stopped
    rewind: dict | None = None  # the watched run: keep rewind points (child/rewind.py)

    @property
    def own_folder(self) -> str:
        """nandoctor's folder of this diagnosis (events, logs, the other runs): a re-run writes
        there as it is, never into its scratch folder."""
        return os.path.dirname(self.events_path)

    def events_path_of_this_process(self) -> str:
        """The events file of this process: one per rank when torchrun launched several."""
        if self.nproc_per_node <= 1:
            return self.events_path
        from nandoctor.child.events import rank_events_path

        return rank_events_path(self.events_path, int(os.environ.get("RANK", "0")))

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(asdict(self), file)

    @classmethod
    def load(cls, path: str) -> ChildOptions:
        with open(path, encoding="utf-8") as file:
            return cls(**json.load(file))
