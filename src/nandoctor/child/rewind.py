"""Rewind points: the watched run keeps a frozen copy of itself from shortly before the failure.

At step boundaries the watched run forks. The copy (a *rewind point*) does no work: it waits on
a Unix socket. A re-run (the localizing replay, a fix verification, a learning-rate candidate,
a shadowed comparison) asks it for a run; the point forks again, and that grandchild reconfigures
nandoctor's instrumentation for the re-run's options and returns into the script, which goes on
from the step where the point was taken instead of from step 0.

When a fork is safe: one thread, no child processes (DataLoader workers, launched helpers), no
CUDA context, no process group, no compiled code (it would run compiled in a re-run that needs
eager ops). A forked process cannot use its parent's OpenMP thread pool (the threads are not
copied; the first parallel op would wait for them forever), so the watched run ends its
OpenMP workers just before each fork (`omp_pause_resource_all`) and a resumed run starts a
pool of its own with the watched run's thread count; where no runtime can be paused it
computes on one intra-op thread. Everything else is refused, once per reason, and re-runs
start from step 0.

Points are taken on a clock, not a step count: a new one once `interval_fraction` of the run's
time so far has passed since the last (at least `min_interval_s`, and at least 20 times what
the last point cost: the fork, and the page copies that slow the step after it; so points cost
at most about 5 % of the run), so their number
grows with the log of the run's length, and the newest lies within that fraction of the run
before the failure. The newest `keep` are kept; older ones are ended. While the run is running
away (the median of its last few losses `runaway_factor` times its lowest of the last 100 steps)
no point is taken: the one kept stays from before the loss began to climb, where a smaller rate
or a clip can still be tried on a healthy state. A point costs the memory
the watched run rewrites after the fork (copy on write): about one copy of parameters,
optimizer state and activations.

Fresh starts: before the script runs, the watched run leaves one more copy of itself (torch and
nandoctor imported, nothing else done) that serves re-runs from step 0 the same way, so that
they do not start a new interpreter and import torch again.

Files: a resumed run writes into its scratch folder (instrument/files.py), and files the script
already held open for writing get private copies in that folder, at the same offset, so the
user's log or CSV is not appended to by a re-run.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import json
import math
import os
import secrets
import select
import shutil
import signal
import socket
import stat
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable

from nandoctor.child.bootstrap import announce_start, die_with_parent, keep_writes_in_scratch
from nandoctor.child.options import ChildOptions

_POLL_S = 0.2
# A point is due no sooner than this many times what the last one cost: points take at most
# about 1/20 of the run's time.
_OVERHEAD_FACTOR = 20.0
# The loss level a runaway is measured on: the median of this many recent step losses (one
# noisy batch neither starts nor ends a runaway) ...
_LEVEL_STEPS = 5
# ... against its lowest over this many steps: a climb that outruns it is a runaway; a slow
# drift (a warm-up raising the loss over thousands of steps, a KL weight annealed in) is not,
# and a point is never held back for longer than this.
_LOW_WINDOW = 100


class RewindKeeper:
    """In the watched run: takes, keeps and retires rewind points."""

    def __init__(self, session, settings: dict) -> None:
        self.session = session
        self.keep = int(settings.get("keep", 1))
        self.min_interval_s = float(settings.get("min_interval_s", 0.5))
        self.fraction = float(settings.get("interval_fraction", 0.05))
        self.started = time.monotonic()
        self.last = self.started
        self.points: list[tuple[int, int]] = []  # (step, pid) of the live points, oldest first
        self._refused: set[str] = set()
        self._last_cost = 0.0  # seconds the last point took to take
        self._launcher = os.getppid()  # the nandoctor process: points end when it is gone
        self._boundary = self.started  # when the last step ended
        self._plain_step_s: float | None = None  # the shortest step not right after a point
        self._just_forked = False
        self.runaway_factor = float(settings.get("runaway_factor", 3.0))
        self._recent: collections.deque[float] = collections.deque(maxlen=_LEVEL_STEPS)
        self._levels: collections.deque[float] = collections.deque(maxlen=_LOW_WINDOW)

    def at_step_boundary(self, loss: float | None = None) -> None:
        """Between two optimizer steps: take a point when one is due, a fork is safe and the
        run is not running away."""
        now = time.monotonic()
        self._time_the_step(now)
        if self._running_away(loss):
            return  # keep the point from before; one is taken once the loss is back down
        due = max(self.min_interval_s, self.fraction * (now - self.started),
                  _OVERHEAD_FACTOR * self._last_cost)  # fmt: skip
        if now - self.last < due:
            return
        reason = fork_unsafe_reason(self.session, own={pid for _, pid in self.points})
        if reason is None:
            try:
                self._take_point()
            except OSError as error:  # no point is no reason to fail the user's run
                reason = f"a rewind point could not be taken: {error}"
        if reason is not None:
            self._refuse(reason)
        # Counted from the end of this one: forking a large process takes a while.
        self.last = time.monotonic()
        self._last_cost = self.last - now
        self._just_forked = reason is None
        self._boundary = self.last

    def _running_away(self, loss: float | None) -> bool:
        """The median of the last few losses is `runaway_factor` times its lowest over the last
        `_LOW_WINDOW` steps. Only positive losses have a scale to compare (a log-likelihood or a
        GAN's losses may be negative); a non-finite one is past any point worth taking."""
        if loss is None:
            return False
        if not math.isfinite(loss):
            return True
        self._recent.append(loss)
        if len(self._recent) < _LEVEL_STEPS:
            return False
        level = statistics.median(self._recent)
        self._levels.append(level)
        lowest = min(self._levels)
        return lowest > 0 and level > self.runaway_factor * lowest

    def _time_the_step(self, now: float) -> None:
        """Add to the last point's cost what the step after it took beyond a plain step: its
        first writes to each page copy that page (copy on write), which costs the watched run
        more than the fork itself when the process is large."""
        took, self._boundary = now - self._boundary, now
        if self._just_forked:
            self._just_forked = False
            if self._plain_step_s is not None:
                self._last_cost += max(0.0, took - self._plain_step_s)
        elif self._plain_step_s is None or took < self._plain_step_s:
            self._plain_step_s = took

    def _refuse(self, reason: str) -> None:
        if reason not in self._refused:
            self._refused.add(reason)
            self.session.events.emit("rewind_refused", step=self.session.step, reason=reason)

    def _take_point(self) -> None:
        step = self.session.step
        # An abstract socket (Linux): no path to outgrow a long TMPDIR, nothing left on disk.
        # Only processes of this user are served (checked on each connection).
        name = f"nandoctor-{os.getpid()}-{step}-{secrets.token_hex(8)}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind("\0" + name)
            listener.listen(16)
        except OSError:
            listener.close()
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        threads_released = release_openmp_threads()
        pid = os.fork()
        if pid == 0:  # the point: serves until a re-run asks; returns only in that re-run
            request = _serve(listener, self._launcher)
            resume(self.session, request, step, threads_released)
            return
        listener.close()
        self.points.append((step, pid))
        self.session.events.emit("rewind_point", step=step, pid=pid, socket=name)
        while len(self.points) > self.keep:
            self._retire(*self.points.pop(0))

    def _retire(self, step: int, pid: int) -> None:
        # No run was resumed from it yet (that happens after the watched run): nothing to end
        # gracefully, and the watched run must not wait for the point's next poll.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self.session.events.emit("rewind_retired", step=step, pid=pid)


def fork_unsafe_reason(session, own: set[int] = frozenset()) -> str | None:
    """Why this process cannot be forked into a working copy now, or None. `own`: the rewind
    points, children of this process that a fork need not take along."""
    import torch

    from nandoctor.instrument.tensors import process_group_initialized

    if children := [pid for pid in _child_processes() if pid not in own | _fresh_start_copies]:
        return (f"the script has child processes ({len(children)}, e.g. DataLoader workers): "
                "a fork cannot take them along")  # fmt: skip
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return (f"the script runs other threads ({', '.join(sorted(others)[:3])}): a fork "
                "copies their locks but not them")  # fmt: skip
    if torch.cuda.is_initialized():
        return "CUDA is in use: a CUDA context cannot be forked"
    if process_group_initialized():
        return "a torch.distributed process group is in use: its peers cannot be forked"
    if session.compiled:
        return "the script uses torch.compile: a re-run from a copy would keep it compiled"
    return None


def _child_processes() -> list[int]:
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as file:
                pids += [int(p) for p in file.read().split()]
    return pids


# ---- the point ------------------------------------------------------------------------------
def _serve(
    listener: socket.socket, launcher: int, before_the_first: Callable[[], None] | None = None
) -> dict:
    """Wait for re-run requests; fork one process per request and report how it ended. Returns
    (in the forked process only) the request it is to run. `before_the_first`: called once,
    when the first request has arrived (work a run that ends healthy should not pay for)."""
    os.setsid()  # signals for the watched run's process group are not for the point
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    gc.disable()  # a collection would touch, and so copy, every object's memory
    _return_free_heap_to_the_system()
    ending = []
    signal.signal(signal.SIGTERM, lambda *_: ending.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    waiting: list[socket.socket] = []  # connections whose request has not arrived
    running: dict[int, socket.socket] = {}  # pid of a resumed run -> its requester
    while not ending and _alive(launcher):
        readable, _, _ = select.select([listener, *waiting], [], [], _POLL_S)
        for ready in readable:
            if ready is listener:
                connection = listener.accept()[0]
                if _same_user(connection):
                    waiting.append(connection)
                else:
                    connection.close()
                continue
            waiting.remove(ready)
            request = _read_request(ready)
            if request is None:
                ready.close()
                continue
            if before_the_first is not None:
                before_the_first()
                before_the_first = None
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in (*waiting, *running.values(), ready):
                    other.close()
                _restore_signals()
                return request
            running[pid] = ready
            _send(ready, {"pid": pid})
        _reap(running)
    for pid in running:  # nandoctor is gone or done: so are the runs it asked for
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os._exit(0)


def _return_free_heap_to_the_system() -> None:
    """A point outlives the run it copies, and then every page it holds is its own, the heap's
    free chunks too (the allocator's cache of freed activations: ~70 MB on a 55M-parameter MLP).
    glibc's malloc_trim hands them back; the watched run's copies are not touched."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _same_user(connection: socket.socket) -> bool:
    """The connecting process runs as this process's user (SO_PEERCRED: pid, uid, gid)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))  # fmt: skip
    _, uid, _ = struct.unpack("3i", credentials)
    return uid == os.getuid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_request(connection: socket.socket) -> dict | None:
    data = b""
    connection.settimeout(5.0)
    with contextlib.suppress(OSError):
        while not data.endswith(b"\n"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
    try:
        return json.loads(data)
    except ValueError:
        return None


def _send(connection: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(message).encode() + b"\n")


def _reap(running: dict[int, socket.socket]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = running.pop(pid, None)
        if connection is not None:
            _send(connection, {"exit": os.waitstatus_to_exitcode(status)})
            connection.close()


def _restore_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ---- the fresh start ------------------------------------------------------------------------
_fresh_start_copies: set[int] = set()  # the copy left before the script ran: not the script's
_ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # an NVIDIA or an AMD GPU's driver


def offer_fresh_starts(options: ChildOptions) -> tuple[ChildOptions, dict | None]:
    """Before the script runs, the watched run leaves a copy of itself that has imported torch
    and nandoctor and done nothing else; a re-run from step 0 is forked from it rather than
    started as a new interpreter, which would spend a second or more importing torch again.
    No op has run yet, so OpenMP's pool does not exist and the fork may use every thread.

    Returns, in the watched run, its own options and the copy to announce (or None when no
    copy could be left); in a re-run forked from the copy, that re-run's options and None."""
    import torch  # noqa: F401  (what the copy is for: imported once, here)

    import nandoctor.child.session  # noqa: F401  (and everything a run instruments torch with)

    if not sys.platform.startswith("linux"):
        return options, None  # an abstract socket and /proc: Linux only, as rewind points
    if threading.active_count() > 1 or _child_processes():
        return options, None  # a fork would copy their locks but not them
    if any(os.path.exists(device) for device in _ACCELERATOR_DEVICES):
        # A GPU driver touched before a fork (torch.cuda.is_available() can be enough) may
        # not initialize in the forked run: there, re-runs start as new processes.
        return options, None
    launcher = os.getppid()  # the nandoctor process: the copy ends when it is gone
    name = f"nandoctor-{os.getpid()}-start-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)
        listener.listen(16)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except OSError:
        listener.close()
        return options, None
    if pid == 0:  # the copy: serves until a re-run asks; returns only in that re-run
        request = _serve(listener, launcher, before_the_first=_import_ahead)
        return _become_the_requested_run(request), None
    listener.close()
    _fresh_start_copies.add(pid)
    return options, {"pid": pid, "socket": name}


def _import_ahead() -> None:
    """In the copy, before its first run: what nearly every run imports on its own, so that
    each run forked from it need not (torch.optim's first step imports torch._dynamo, about a
    second). It starts no thread and runs no op."""
    with contextlib.suppress(Exception):
        import torch._dynamo  # noqa: F401


def _become_the_requested_run(request: dict) -> ChildOptions:
    """A process forked for a re-run: its own process group, as a run started from step 0
    has; gone with the copy or point that forked it; its output into the re-run's log. Returns
    the re-run's options."""
    os.setsid()
    die_with_parent()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    gc.enable()  # the copy or point serves with it off (see _serve)
    return ChildOptions.load(request["options"])


# ---- the resumed run ------------------------------------------------------------------------
def resume(session, request: dict, step: int, threads_released: bool) -> None:
    """In the process a re-run asked for: become that run, then go back into the script.
    `threads_released`: the watched run ended OpenMP's worker threads before the fork, so this
    run can start a pool of its own; otherwise the parent's pool, which a fork does not copy,
    would hang the first parallel op, and the run computes on one thread."""
    import torch

    options = _become_the_requested_run(request)
    torch.set_num_threads((options.threads or torch.get_num_threads()) if threads_released else 1)
    session.events.retarget(options.events_path)
    # no CUDA: a point is only taken in a process that never used it
    announce_start(session.events, options, cuda=False, resumed_from=step)
    if options.scratch_dir:
        private_copies_of_open_files(options.scratch_dir, keep=(options.own_folder,))
    keep_writes_in_scratch(options)
    session.resume_as(options)


# OpenMP runtimes that torch builds link (GNU's with the pip wheels, Intel's and LLVM's in
# other builds), by the start of their file name.
_OPENMP_RUNTIMES = ("libgomp", "libiomp5", "libomp")
_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: omp_pause_hard ends the runtime's threads


def release_openmp_threads() -> bool:
    """Ends the worker threads of every OpenMP runtime in the process (OpenMP 5.0's
    `omp_pause_resource_all`), so that a forked copy starts a pool of its own instead of waiting
    forever on its parent's; this process starts new workers at its next parallel op, in about
    a millisecond. False when a runtime could not be paused, or none was found."""
    runtimes = _loaded_libraries(_OPENMP_RUNTIMES)
    if not runtimes:
        return False
    try:
        return all(ctypes.CDLL(path).omp_pause_resource_all(_OMP_PAUSE_HARD) == 0
                   for path in runtimes)  # fmt: skip
    except (OSError, AttributeError):  # a runtime older than OpenMP 5.0
        return False


def _loaded_libraries(prefixes: tuple[str, ...]) -> list[str]:
    """The files of the shared libraries loaded in this process whose names start with one of
    `prefixes`."""
    paths: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if path.startswith("/") and os.path.basename(path).startswith(prefixes):
                paths.add(path)
    return sorted(paths)


def private_copies_of_open_files(scratch_dir: str, keep: tuple[str, ...]) -> list[str]:
    """Files this process holds open for writing, replaced (same descriptor, same offset) by
    copies in `scratch_dir`: the watched run opened them, a re-run must not write to them."""
    copied = []
    for fd in _open_descriptors():
        path = _writable_regular_file(fd)
        if path is None or any(path.startswith(folder + os.sep) for folder in keep):
            continue
        copy = os.path.join(scratch_dir, "open-files", path.lstrip(os.sep))
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copyfile(path, copy)
        flags = _descriptor_flags(fd) & (os.O_ACCMODE | os.O_APPEND)
        replacement = os.open(copy, flags)
        os.lseek(replacement, os.lseek(fd, 0, os.SEEK_CUR), os.SEEK_SET)
        os.dup2(replacement, fd)
        os.close(replacement)
        copied.append(path)
    return copied


def _open_descriptors() -> list[int]:
    try:
        return sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2)
    except OSError:
        return []


def _writable_regular_file(fd: int) -> str | None:
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if _descriptor_flags(fd) & os.O_ACCMODE == os.O_RDONLY:
            return None
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return path if os.path.isfile(path) else None  # a deleted file holds nothing of the user's


def _descriptor_flags(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as file:
        for line in file:
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    return 0
