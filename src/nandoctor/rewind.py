"""Where a re-run starts: from a rewind point the watched run kept, or from step 0, and why.

The watched run keeps frozen copies of itself at step boundaries (child/rewind.py announces
each with a `rewind_point` event). A re-run that only needs the steps around the failure (the
localizing replay, a fix that acts on the failing op, the shadowed comparison) starts from the
newest point before the failure; one that asks whether something done earlier would have
avoided it (a smaller learning rate, clipped gradients) needs a point some steps before it; a
fix that acts when the model or optimizer is built (their settings, initialization, dtype)
starts from step 0. The report lists every re-run with the step it started from and why.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

_CONNECT_TIMEOUT_S = 10.0
_ANSWER_TIMEOUT_S = 30.0  # forking a large process, and a point busy forking another run


@dataclass(frozen=True)
class RewindPoint:
    step: int  # the run resumes before this optimizer step
    pid: int
    socket: str  # the name of its abstract Unix socket


@dataclass(frozen=True)
class Start:
    """Where one re-run starts, and why there."""

    point: RewindPoint | None
    why: str

    @property
    def step(self) -> int:
        return self.point.step if self.point else 0


FROM_THE_START = Start(None, "from step 0")


def live_points(events: list[dict]) -> list[RewindPoint]:
    """The rewind points the watched run still keeps, oldest first."""
    retired = {e["pid"] for e in events if e["event"] == "rewind_retired"}
    return [RewindPoint(e["step"], e["pid"], e["socket"]) for e in events
            if e["event"] == "rewind_point" and e["pid"] not in retired]  # fmt: skip


def start_for(events: list[dict], latest: int, lead: int = 0) -> Start:
    """The newest point at least `lead` steps before step `latest` (a point at step S resumes
    before step S runs); else step 0, with the reason none fits."""
    points = live_points(events)
    fitting = [p for p in points if p.step <= latest - lead]
    if fitting:
        point = fitting[-1]
        return Start(point, f"from the rewind point at step {point.step}")
    if points:
        need = f"{lead} steps before step {latest}" if lead else f"at or before step {latest}"
        return Start(None, f"from step 0: no rewind point {need} (kept: steps "
                           f"{', '.join(str(p.step) for p in points)})")  # fmt: skip
    refused = next((e for e in events if e["event"] == "rewind_refused"), None)
    if refused is not None:
        return Start(None, f"from step 0: no rewind point could be taken "
                           f"(step {refused['step']}: {refused['reason']})")  # fmt: skip
    return Start(None, "from step 0: the run failed before a rewind point was due")


def release(events: list[dict]) -> None:
    """End the points the watched run left, and its copy for fresh starts: nothing will
    resume from them."""
    global _fresh_starts
    copy = _fresh_start_copy_in(events)
    for point in [*live_points(events), *([copy] if copy else [])]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(point.pid, signal.SIGTERM)
    _fresh_starts = None


# The watched run's copy taken before its script ran (child/rewind.py, `offer_fresh_starts`):
# re-runs from step 0 of this diagnosis fork from it until `release`. One diagnosis at a time
# per process, as the CLI and the API run them.
_fresh_starts: RewindPoint | None = None


def offer_fresh_starts(events: list[dict]) -> None:
    """Re-runs from step 0 start from the watched run's copy, if it left one."""
    global _fresh_starts
    _fresh_starts = _fresh_start_copy_in(events)


def fresh_start_copy() -> RewindPoint | None:
    return _fresh_starts


def _fresh_start_copy_in(events: list[dict]) -> RewindPoint | None:
    """The copy the watched run announced (a point before step 0), or None."""
    copy = next((e for e in events if e["event"] == "fresh_starts"), None)
    return RewindPoint(0, copy["pid"], copy["socket"]) if copy else None


class RewoundProcess:
    """A re-run resumed from a rewind point, driven like a `subprocess.Popen`: the point forks
    it, and tells over the connection how it ended."""

    def __init__(self, point: RewindPoint, options_path: str, log_path: str) -> None:
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._connection.settimeout(_CONNECT_TIMEOUT_S)
        self._buffer = b""
        self.returncode: int | None = None
        try:
            self._connection.connect("\0" + point.socket)  # an abstract socket (Linux)
            request = {"options": options_path, "log": log_path}
            self._connection.sendall(json.dumps(request).encode() + b"\n")
            answer = self._next_message(_ANSWER_TIMEOUT_S)
        except OSError:
            self._connection.close()
            raise
        if answer is None or "pid" not in answer:
            self._connection.close()
            raise OSError(f"the rewind point at step {point.step} did not start the run")
        self.pid: int = answer["pid"]

    def _next_message(self, timeout: float | None) -> dict | None:
        """The next line from the point; None at the end of the connection. Raises
        TimeoutError when nothing complete arrived in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._connection], [], [], left)
            if not readable:
                raise TimeoutError
            chunk = self._connection.recv(4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        try:
            message = self._next_message(timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired("rewound run", timeout) from None
        except OSError:
            message = None
        # The point itself was killed: the run died with it (it asked for SIGKILL then).
        self.returncode = -signal.SIGKILL if message is None else int(message["exit"])
        self._connection.close()
        return self.returncode
