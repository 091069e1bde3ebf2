"""Candidate runs in parallel child processes: start them, stream their events, stop the ones
the sweep no longer needs, and turn what each left behind into a `RunRecord`."""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import signal
import threading
import time
from dataclasses import dataclass, field

from nandoctor.child.options import ChildOptions
from nandoctor.rewind import Start
from nandoctor.runner import RunOutcome, child_environment, run_child, signal_groups
from nandoctor.stages.lr_sweep.batch_spikes import WINDOW
from nandoctor.stages.lr_sweep.search import Planned, RunRecord
from nandoctor.stages.lr_sweep.verdicts import Verdict, blew_up, classify

EVENT, FINISHED = "event", "finished"
# A run asked to stop ends at its next optimizer step; one stuck elsewhere (data loading, a
# hung collective) is killed after this many seconds. A run whose results will be thrown away
# gets less.
STOP_GRACE_S = 10.0
DISCARD_GRACE_S = 2.0
_NAN_WORDS = re.compile(r"\b(nan|inf|infinite|non-finite|not finite)\b", re.IGNORECASE)


@dataclass
class ActiveRun:
    planned: Planned
    stop_file: str
    slot: int
    pids: list[int] = field(default_factory=list)  # one per rank of a torchrun launch
    losses: list[float | None] = field(default_factory=list)
    stop_requested_at: float | None = None
    kill_at: float | None = None
    next_blow_up_check: int = 1

    @property
    def steps(self) -> int:
        return len(self.losses)

    def due_for_blow_up_check(self) -> bool:
        """Whether the history is to be judged for a blow-up now. Judging it costs time in its
        length, so it is judged after every step at first and then once every 1/32 of the steps
        so far: a blow-up is still caught within 3 % of the run, and a candidate of H steps
        costs O(H log H) judgements instead of O(H^2)."""
        if self.steps < self.next_blow_up_check:
            return False
        self.next_blow_up_check = self.steps + max(1, self.steps // 32)
        return True


class Pool:
    """At most `jobs` child runs at once, each in a thread that waits on its process."""

    def __init__(self, workdir: str, jobs: int, timeout_s: float, devices: list[str]) -> None:
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.devices = devices
        self.active: dict[str, ActiveRun] = {}
        self._slots = list(range(jobs))
        self._items: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []

    @property
    def free(self) -> int:
        return len(self._slots)

    def start(self, planned: Planned, options: ChildOptions, start: Start) -> None:
        slot = self._slots.pop(0)
        name = f"lr_sweep-{planned.key}"
        stop_file = os.path.join(self.workdir, f"{name}.stop")
        options.extra.setdefault("lr_sweep", {})["stop_file"] = stop_file
        env = None  # the child's usual environment
        if self.devices:  # one accelerator per slot, round robin
            env = child_environment(seeded=options.seed is not None)
            env["CUDA_VISIBLE_DEVICES"] = self.devices[slot % len(self.devices)]
        self.active[planned.key] = ActiveRun(planned, stop_file, slot)
        thread = threading.Thread(
            target=self._run, args=(planned.key, options, name, env, start), daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _run(
        self, key: str, options: ChildOptions, name: str, env: dict | None, start: Start
    ) -> None:
        try:
            outcome = run_child(
                options,
                self.workdir,
                timeout_s=self.timeout_s,
                on_event=lambda event: self._items.put((EVENT, key, event)),
                env=env,
                name=name,
                start=start,
            )
        except Exception as error:  # a launch failure is this candidate's error, not the sweep's
            text = f"{type(error).__name__}: {error}"
            outcome = RunOutcome(events=[{"event": "internal_error", "text": text}])
        self._items.put((FINISHED, key, outcome))

    def next_item(self, timeout: float) -> tuple[str, str, object] | None:
        """The next event or finished run; kills runs that ignored a stop request meanwhile."""
        try:
            item = self._items.get(timeout=timeout)
        except queue.Empty:
            item = None
        self._kill_overdue()
        if item is not None:
            kind, key, payload = item
            run = self.active.get(key)
            if run is not None and kind == EVENT:
                self._note(run, payload)
            elif run is not None and kind == FINISHED:
                del self.active[key]
                self._slots.append(run.slot)
                self._slots.sort()
        return item

    def _note(self, run: ActiveRun, event: dict) -> None:
        if event.get("event") == "start" and event.get("pid"):
            run.pids.append(event["pid"])
        elif event.get("event") == "step" and event.get("rank", 0) == 0:
            run.losses.append(event.get("loss"))  # of a torchrun launch: rank 0's curve

    def stop(self, key: str, grace_s: float = STOP_GRACE_S) -> None:
        """Ask a run to end at its next step (it checks for its stop file); kill it after
        `grace_s` seconds if it has not."""
        run = self.active.get(key)
        if run is None or run.stop_requested_at is not None:
            return
        with open(run.stop_file, "w", encoding="utf-8"):
            pass
        run.stop_requested_at = time.monotonic()
        run.kill_at = run.stop_requested_at + grace_s

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for run in self.active.values():
            if run.kill_at is not None and run.pids and now > run.kill_at:
                # Each child (each rank) leads its own process group: this reaches its
                # DataLoader workers too, and nothing else.
                signal_groups(run.pids, signal.SIGKILL)
                run.pids = []

    def shutdown(self) -> None:
        """Stop every run still going and wait for their processes to end."""
        for key in list(self.active):
            self.stop(key, DISCARD_GRACE_S)
        # A run that has not started its script yet stops at its first step, or is killed once
        # its pid is known; the runner's own timeout is the last resort.
        deadline = time.monotonic() + STOP_GRACE_S + 30
        while self.active and time.monotonic() < deadline:
            self.next_item(timeout=0.2)
        for thread in self._threads:
            thread.join(timeout=1.0)


def run_error(outcome: RunOutcome, timeout_s: float) -> str | None:
    """Why a run gave no usable history, or None when it did."""
    if internal := outcome.first("internal_error"):
        return f"nandoctor could not start the run: {internal.get('text')}"
    if error := outcome.first("script_error"):
        return f"the script raised {error.get('type')}: {error.get('message')}"
    if (exit_event := outcome.first("script_exit")) and exit_event.get("code"):
        return f"the script exited with code {exit_event.get('code')}"
    if outcome.timed_out:
        return f"timed out after {timeout_s:.0f}s"
    if outcome.interrupted:
        return "interrupted"
    if outcome.crashed:
        return f"the run's process died (exit code {outcome.returncode})"
    return None


def record_from(
    planned: Planned,
    outcome: RunOutcome,
    settings,
    horizon: int,
    *,
    timeout_s: float = 0.0,
    stopped_by_sweep: bool = False,
    first_step: int = 0,
) -> RunRecord:
    """The history and verdict of one finished run. From a rewind point at `first_step`, the
    steps from there on are judged (the earlier ones are the watched run's, the same for every
    candidate); the failure steps still count from step 0."""
    steps = [s for s in outcome.steps if s["step"] >= first_step]
    earlier = [s for s in outcome.steps if s["step"] < first_step]
    before = [s for s in earlier if s["step"] >= first_step - WINDOW]
    losses = [s.get("loss") for s in steps]
    amp = outcome.all("lr_sweep_amp")
    unscaled = {
        e["steps"] - 1: e["loss"] for e in amp if not e["skipped"] and e.get("loss") is not None
    }
    losses = [unscaled.get(i, loss) for i, loss in enumerate(losses)]
    grad_norms = [s.get("grad_norm") for s in steps]
    nonfinite = outcome.nonfinite
    error = None if nonfinite or stopped_by_sweep else run_error(outcome, timeout_s)
    if error and _NAN_WORDS.search(error):  # the script's own NaN check got there first
        verdict = Verdict("diverged", "D1", error, len(steps))
    elif error and blew_up(losses, settings, horizon):  # OverflowError in math.exp(loss)
        verdict = Verdict("diverged", "D2", f"the loss blew up, then {error}", len(steps) - 1)
    elif error:
        verdict = Verdict("error", "error", error)
    else:
        verdict = classify(
            losses,
            grad_norms,
            settings,
            horizon=horizon,
            nonfinite_step=nonfinite["step"] - first_step if nonfinite else None,
            skipped_steps=sum(1 for e in amp if e["skipped"]),
            min_scale=min((e["scale"] for e in amp), default=None),
            clipped=planned.clip is not None,
            first_step=first_step,
        )
    if verdict.failure_step is not None and error:  # `classify` counts from step 0 itself
        verdict = dataclasses.replace(verdict, failure_step=verdict.failure_step + first_step)
    return RunRecord(
        planned=planned,
        verdict=verdict,
        first_step=first_step,
        losses=losses,
        grad_norms=grad_norms,
        lrs=[s.get("lr") or [] for s in steps],
        norms_before=[s.get("grad_norm") for s in before],
        lrs_before=[s.get("lr") or [] for s in before],
        losses_before=[s.get("loss") for s in earlier],
        nonfinite_step=nonfinite["step"] if nonfinite else None,
        ended=(outcome.end or {}).get("outcome") or ("timeout" if outcome.timed_out else "died"),
        duration_s=outcome.duration_s,
        optimizers=outcome.all("lr_sweep_optimizer") or _watched_optimizers(outcome),
        schedulers=outcome.all("lr_sweep_scheduler"),
    )


def _watched_optimizers(outcome: RunOutcome) -> list[dict]:
    """The optimizers as the watched run saw them built (a sweep from a rewind point builds
    none), in the shape the candidates record them."""
    return [{"class_name": e["type"], "location": e.get("location"),
             "lrs": e.get("lrs") or [e["settings"].get("lr")] * e.get("groups", 1)}
            for e in outcome.all("optimizer")]  # fmt: skip
