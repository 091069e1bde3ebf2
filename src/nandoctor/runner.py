"""Launch one child run of the user's script and collect what it reports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import nandoctor
from nandoctor import interrupts
from nandoctor.child.events import first_event, rank_events_path, read_events
from nandoctor.child.options import USER_ENVIRONMENT, ChildOptions
from nandoctor.rewind import RewoundProcess, Start, fresh_start_copy

if TYPE_CHECKING:
    from nandoctor.config import Config
    from nandoctor.target import Target

_KILL_GRACE_S = 5.0
_RERUN_STARTUP_S = 60.0  # interpreter, torch import and the script's own set-up
_POLL_S = 0.1


@dataclass
class RunOutcome:
    """What one child run left behind: its events, how it ended, where its output went."""

    events: list[dict] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    interrupted: bool = False
    duration_s: float = 0.0
    log_path: str | None = None
    # A torchrun launch: every rank's events. `events` are those of `rank`, the rank that went
    # non-finite first (else failed first, else rank 0), so stages read one coherent run.
    ranks: dict[int, list[dict]] = field(default_factory=dict)
    rank: int | None = None
    # A re-run resumed from a rewind point: the steps before it are the watched run's, and its
    # events start at this step.
    start_step: int = 0

    @property
    def steps_done(self) -> int:
        """Optimizer steps completed, counted from step 0 also for a resumed run."""
        return self.start_step + len(self.steps)

    def all(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def first(self, kind: str) -> dict | None:
        return first_event(self.events, kind)

    @property
    def steps(self) -> list[dict]:
        return self.all("step")

    @property
    def updates_by_hand(self) -> bool:
        """Steps were taken but no torch.optim optimizer was built: the script updates its
        parameters itself (`p.data.add_(p.grad, alpha=-lr)`), one step per backward pass."""
        return bool(self.steps) and not self.all("optimizer")

    @property
    def losses(self) -> list[float | None]:
        """The loss of each step (None where the step recorded none)."""
        return [s.get("loss") for s in self.steps]

    @property
    def grad_norms(self) -> list[float | None]:
        """The gradient norm of each step, as the loss."""
        return [s.get("grad_norm") for s in self.steps]

    @property
    def nonfinite(self) -> dict | None:
        return self.first("nonfinite")

    @property
    def end(self) -> dict | None:
        return self.first("end")

    @property
    def died(self) -> bool:
        """The script raised, or exited with a non-zero code."""
        exit_event = self.first("script_exit")
        return self.first("script_error") is not None or bool(exit_event and exit_event.get("code"))

    @property
    def failed_step(self) -> int | None:
        """The step the run failed at: its first NaN/Inf that mattered, or the step its script
        died at after its loss diverged (OverflowError in `math.exp(loss)`, an assert on it)."""
        if self.nonfinite is not None:
            return self.nonfinite["step"]
        died = self.diverged_then_died
        return died[0] if died else None

    @property
    def diverged_then_died(self) -> tuple[int, str] | None:
        """(step, evidence) when no NaN/Inf was seen but the script died after its loss grew
        tenfold (ranking.diverged_then_died)."""
        from nandoctor.ranking import diverged_then_died

        if self.nonfinite is not None:
            return None
        return diverged_then_died(self.losses, self.died)

    @property
    def crashed(self) -> bool:
        """The child died without saying goodbye (segfault, os._exit, killed)."""
        return self.end is None and not self.timed_out and not self.interrupted

    def output_tail(self, lines: int = 30) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as file:
            return "".join(file.readlines()[-lines:])


def script_options(target: Target, config: Config, **fields) -> ChildOptions:
    """One child run of the user's script: its arguments, and the watched run's seed, thread
    count and step budget, so runs of one script are comparable; `fields` override."""
    base = {
        "script": target.script,
        "args": list(target.args),
        "events_path": "",
        "max_steps": config.watch.max_steps,
        "seed": config.watch.seed,
        "threads": config.watch.threads,
        "nproc_per_node": target.nproc_per_node,
        "rank_grace_s": config.watch.rank_grace_s,
    }
    return ChildOptions(**{**base, **fields})


def rerun_options(
    target: Target, config: Config, workdir: str, name: str, **fields
) -> ChildOptions:
    """A re-run (replay, verification, sweep candidate, comparison): step-level checks unless
    asked otherwise, and everything the script writes goes to a fresh scratch folder in
    `workdir`, never over the user's files."""
    fields.setdefault("detect", False)
    fields.setdefault("scratch_dir", tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    return script_options(target, config, **fields)


def rerun_timeout_s(config: Config, watch: RunOutcome, steps: int) -> float:
    """A re-run's wall-clock limit: 60 s plus three times what the watched run took for `steps`
    steps, and never more than the user's `--timeout`. With no `--timeout` the watched run has
    no limit, but a re-run (a fix applied, a smaller learning rate) may hang where the original
    did not, and must not hold the report forever."""
    per_step = watch.duration_s / max(1, len(watch.steps))
    derived = _RERUN_STARTUP_S + 3 * steps * per_step
    limit = config.watch.timeout_s
    return derived if limit is None else min(limit, derived)


# What the interpreter must read at start-up; the child's bootstrap puts the user's own values
# back into os.environ before the script runs (USER_ENVIRONMENT holds them), so the script and
# whatever it starts see the environment `python train.py` would.
_UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # the log keeps the last lines of a crashed run
_HASH_SEEDED = {"PYTHONHASHSEED": "0"}  # set and dict-of-str orders, the same in every run


def child_environment(seeded: bool = True) -> dict[str, str]:
    """The user's environment, plus what the child's interpreter must find at start-up."""
    env = dict(os.environ)
    startup = {**_UNBUFFERED, **(_HASH_SEEDED if seeded else {})}
    env[USER_ENVIRONMENT] = json.dumps({name: env.get(name) for name in startup})
    env.update(startup)
    return env


def run_child(
    options: ChildOptions,
    workdir: str,
    *,
    timeout_s: float | None = None,
    on_event: Callable[[dict], None] | None = None,
    show_output: bool = False,
    env: dict[str, str] | None = None,
    name: str = "run",
    start: Start | None = None,
) -> RunOutcome:
    """Run the script in a child process under `options` (through torchrun when it asks for
    several processes); never raises for the script's sake. A re-run names its `start`: a
    rewind point to resume from, or step 0; each is listed in the workdir's re-run log."""
    options_path = os.path.join(workdir, f"{name}.options.json")
    options.events_path = os.path.join(workdir, f"{name}.events.jsonl")
    log_path = os.path.join(workdir, f"{name}.log")
    options.save(options_path)
    outcome = RunOutcome(log_path=log_path)
    streams = _EventStreams(options)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process, start = _launch(options, options_path, log_path, start, show_output, log, env)
        if start is not None:
            outcome.start_step = start.step
            _log_rerun(workdir, name, start)
        try:
            while True:
                done = _wait(process, _POLL_S)
                for event in streams.read():
                    if on_event:
                        on_event(event)
                if done:
                    break
                if interrupts.stop_requested():  # a signal reached nandoctor: in a worker
                    outcome.interrupted = True  # thread, no KeyboardInterrupt reaches here
                    _stop(process, streams.worker_pids())
                elif timeout_s is not None and time.monotonic() - started > timeout_s:
                    outcome.timed_out = True
                    _stop(process, streams.worker_pids())
                elif streams.ranks_left_behind():
                    _stop(process, streams.worker_pids())
        except KeyboardInterrupt:
            outcome.interrupted = True
            _stop(process, streams.worker_pids())
        streams.read()
    outcome.returncode = process.returncode
    outcome.duration_s = time.monotonic() - started
    streams.fill(outcome)
    return outcome


def _launch(options, options_path, log_path, start, show_output, log, env):
    """The child process, resumed from `start`'s rewind point when it has one (step 0 when the
    point does not answer), else from step 0: forked from the watched run's copy taken before
    its script ran when it left one, else a new interpreter; and where it really started."""
    if start is not None and start.point is not None:
        try:
            return RewoundProcess(start.point, options_path, log_path), start
        except OSError as error:
            start = Start(None, f"from step 0: the rewind point at step {start.point.step} did "
                                f"not answer ({error or type(error).__name__})")  # fmt: skip
    copy = fresh_start_copy()
    if copy is not None and env is None and not show_output and options.nproc_per_node <= 1:
        # a run from step 0 forked from the watched run's copy taken before its script ran:
        # the same interpreter, torch already imported; started afresh when it does not answer
        with contextlib.suppress(OSError):
            return RewoundProcess(copy, options_path, log_path), start
    sink = None if show_output else log
    process = subprocess.Popen(
        _launch_command(options, options_path),
        stdin=subprocess.DEVNULL,
        stdout=sink,
        stderr=sink if sink else None,
        env=env or child_environment(seeded=options.seed is not None),
        start_new_session=True,  # one process group: DataLoader workers die with it
    )
    return process, start


RERUN_LOG = "reruns.jsonl"


def _log_rerun(workdir: str, name: str, start: Start) -> None:
    with open(os.path.join(workdir, RERUN_LOG), "a", encoding="utf-8") as file:
        entry = {"run": name, "from_step": start.step, "why": start.why, "t": time.time()}
        file.write(json.dumps(entry) + "\n")


def read_rerun_log(workdir: str) -> list[dict]:
    """Every re-run of this diagnosis, in the order each started: its name, the step it
    started from and why (stages that keep their runs in a folder of their own log there)."""
    folders = [workdir] + sorted(entry.path for entry in os.scandir(workdir) if entry.is_dir())
    reruns = []
    for folder in folders:
        path = os.path.join(folder, RERUN_LOG)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as file:
                reruns += [json.loads(line) for line in file if line.strip()]
    return [{k: v for k, v in rerun.items() if k != "t"}
            for rerun in sorted(reruns, key=lambda rerun: rerun["t"])]  # fmt: skip


def _stopped_by_nandoctor(event: dict) -> bool:
    return event["event"] == "nonfinite" or (
        event["event"] == "end" and event.get("outcome") == "stopped"
    )


# The child starts from `python -c`, so its sys.path is the one `python train.py` has (the
# bootstrap puts the script's folder first); nandoctor's own folder is appended, after
# everything else, only when the interpreter cannot import nandoctor by itself (a source
# checkout run through PYTHONPATH, say), where it shadows nothing.
_BOOTSTRAP = """\
import importlib.util, sys
if importlib.util.find_spec("nandoctor") is None:
    sys.path.append({root!r})
from nandoctor.child.bootstrap import main
main()
"""


def _launch_command(options: ChildOptions, options_path: str) -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(nandoctor.__file__)))
    child = [sys.executable, "-c", _BOOTSTRAP.format(root=root), options_path]
    if options.nproc_per_node <= 1:
        return child
    # PyTorch's own launcher sets RANK, LOCAL_RANK, WORLD_SIZE and the rendezvous for each
    # process, exactly as `torchrun --standalone --nproc-per-node N train.py` would.
    launcher = ["-m", "torch.distributed.run", "--standalone", "--no-python",
                f"--nproc-per-node={options.nproc_per_node}"]  # fmt: skip
    return [sys.executable, *launcher, *child]


class _EventStreams:
    """The events of one child run, or of each rank of a torchrun launch."""

    def __init__(self, options: ChildOptions) -> None:
        if options.nproc_per_node <= 1:
            self._paths = {None: options.events_path}
        else:
            self._paths = {rank: rank_events_path(options.events_path, rank)
                           for rank in range(options.nproc_per_node)}  # fmt: skip
        self._offsets = dict.fromkeys(self._paths, 0)
        self.events: dict[int | None, list[dict]] = {rank: [] for rank in self._paths}
        self._grace_s = options.rank_grace_s
        # kept up as events arrive: the polling loop asks after every read
        self._stopped_since: float | None = None  # when nandoctor first stopped a rank
        self._ended: set[int | None] = set()  # ranks that said goodbye
        self.left_behind: list[int] = []  # ranks stopped because another rank had stopped

    def read(self) -> list[dict]:
        """Events that arrived since the last read, each rank's tagged with its rank."""
        fresh_all = []
        for rank, path in self._paths.items():
            fresh, self._offsets[rank] = read_events(path, self._offsets[rank])
            if rank is not None:
                fresh = [{**event, "rank": rank} for event in fresh]
            self.events[rank] += fresh
            fresh_all += fresh
            if first_event(fresh, "end"):
                self._ended.add(rank)
            if self._stopped_since is None and any(map(_stopped_by_nandoctor, fresh)):
                self._stopped_since = time.monotonic()
        return fresh_all

    def worker_pids(self) -> list[int]:
        """torchrun starts each rank in its own session: stopping the launcher's process group
        does not reach them."""
        starts = (first_event(events, "start")
                  for rank, events in self.events.items() if rank is not None)  # fmt: skip
        return [start["pid"] for start in starts if start and start.get("pid")]

    def ranks_left_behind(self) -> bool:
        """Once nandoctor has stopped one rank (a NaN/Inf, the step budget), the others may wait
        forever in a collective it will never join: true when they still run a grace period
        on. A rank that finished on its own is the script's business (rank 0 evaluating
        alone, say)."""
        if None in self._paths or self._stopped_since is None:
            return False
        running = [rank for rank in self.events if rank not in self._ended]
        if not running or time.monotonic() - self._stopped_since <= self._grace_s:
            return False
        self.left_behind = running
        return True

    def fill(self, outcome: RunOutcome) -> None:
        if None in self._paths:
            outcome.events = self.events[None]
            return
        from nandoctor.distributed import primary_rank

        for rank in self.left_behind:
            if rank not in self._ended:
                self.events[rank].append({"event": "end", "outcome": "stopped", "rank": rank,
                                          "left_behind": True})  # fmt: skip
        outcome.ranks = self.events
        outcome.rank = primary_rank(self.events)
        outcome.events = self.events[outcome.rank]


def _wait(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _stop(process: subprocess.Popen, worker_pids: list[int] = ()) -> None:
    """SIGTERM the child's whole process group (and each torchrun worker's), SIGKILL what is
    left after a grace period."""
    groups = [process.pid, *worker_pids]
    for sig, grace in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
        signal_groups(groups, sig)
        if grace is None:
            process.wait()
        elif _wait(process, grace):
            signal_groups(groups, signal.SIGKILL)  # the groups may still hold orphaned workers
            return


def signal_groups(groups: list[int], sig: signal.Signals) -> None:
    """Signal each process group; one already gone is no error."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
