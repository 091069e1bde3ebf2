"""Launch one child run of the user's script and collect what it reports."""

from __future__ import annotations

import contextlib
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
from nandoctor.child.events import read_events
from nandoctor.child.options import ChildOptions

if TYPE_CHECKING:
    from nandoctor.config import Config
    from nandoctor.target import Target

_KILL_GRACE_S = 5.0
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

    def all(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def first(self, kind: str) -> dict | None:
        return next((e for e in self.events if e["event"] == kind), None)

    @property
    def steps(self) -> list[dict]:
        return self.all("step")

    @property
    def nonfinite(self) -> dict | None:
        return self.first("nonfinite")

    @property
    def end(self) -> dict | None:
        return self.first("end")

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


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(nandoctor.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["PYTHONHASHSEED"] = "0"  # set iteration order in user code, same in every run
    env["PYTHONUNBUFFERED"] = "1"
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
) -> RunOutcome:
    """Run the script in a child process under `options`; never raises for the script's sake."""
    options_path = os.path.join(workdir, f"{name}.options.json")
    options.events_path = os.path.join(workdir, f"{name}.events.jsonl")
    log_path = os.path.join(workdir, f"{name}.log")
    options.save(options_path)
    outcome = RunOutcome(log_path=log_path)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        sink = None if show_output else log
        process = subprocess.Popen(
            [sys.executable, "-m", "nandoctor.child", options_path],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink if sink else None,
            env=env or child_environment(),
            start_new_session=True,  # one process group: DataLoader workers die with it
        )
        offset = 0
        try:
            while True:
                done = _wait(process, _POLL_S)
                fresh, offset = read_events(options.events_path, offset)
                outcome.events += fresh
                for event in fresh:
                    if on_event:
                        on_event(event)
                if done:
                    break
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    outcome.timed_out = True
                    _stop(process)
        except KeyboardInterrupt:
            outcome.interrupted = True
            _stop(process)
        fresh, offset = read_events(options.events_path, offset)
        outcome.events += fresh
    outcome.returncode = process.returncode
    outcome.duration_s = time.monotonic() - started
    return outcome


def _wait(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the child's whole process group, SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        if grace is None:
            process.wait()
        elif _wait(process, grace):
            # the group may still hold orphaned workers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            return
