"""Start-up of a child run: instrument torch, run the script as `python script.py` would."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import random
import runpy
import signal
import sys
import time
import traceback

from nandoctor.child.events import EventWriter
from nandoctor.child.options import USER_ENVIRONMENT, ChildOptions


def main() -> None:
    die_with_parent()  # nandoctor killed outright (SIGKILL) takes its runs along
    _restore_user_environment()
    options = ChildOptions.load(sys.argv[1])
    fresh_starts = None
    if options.rewind and options.rewind.get("fresh_starts"):
        from nandoctor.child.rewind import offer_fresh_starts

        options, fresh_starts = offer_fresh_starts(options)
    events = EventWriter(options.events_path_of_this_process())
    if fresh_starts is not None:
        events.emit("fresh_starts", **fresh_starts)
    try:
        session = _instrument(options, events)
    except Exception as error:  # nandoctor's own failure: say so, run nothing half-instrumented
        events.emit("internal_error", text=f"{type(error).__name__}: {error}",
                    traceback=traceback.format_exc())  # fmt: skip
        sys.exit(70)
    outcome = _run_script(options, session, events)
    session.remove()
    import torch

    # Read at the end: asking earlier can start torch's thread pool before the script sets its
    # own thread count, and idle pool threads then compete with it for the cores.
    events.emit("end", outcome=outcome, steps=session.step, backward_calls=session.backward_calls,
                threads=torch.get_num_threads(), peak_rss_mb=_peak_rss_mb(),
                duration_s=round(time.monotonic() - session.started, 3))  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    if session.options.scratch_dir:
        _end_without_teardown()


def _end_without_teardown() -> None:
    """A re-run has said all it had to in its events, and what its script wrote went to
    scratch: it skips the interpreter's teardown, which frees every tensor and module one by
    one (about half a second for a model of 50M parameters, which every re-run would add to the
    report's wait). The exit handlers still run: those of the script and its libraries end the
    processes they started (DataLoader workers, multiprocessing children)."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the one that started it dies. nandoctor starts
    each run in a session of its own (so its DataLoader workers can be stopped together),
    which a terminal's signals no longer reach."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1  # prctl option: a signal for this process when its parent dies


def _peak_rss_mb() -> float:
    """This process's peak resident memory (a run resumed from a rewind point counts the pages
    it shares with the point too)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def _restore_user_environment() -> None:
    """The user's values of what this interpreter needed at start-up (PYTHONHASHSEED,
    PYTHONUNBUFFERED): the script and what it starts see the environment `python` gives."""
    saved = os.environ.pop(USER_ENVIRONMENT, None)
    for name, value in json.loads(saved or "{}").items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _instrument(options: ChildOptions, events: EventWriter):
    import torch

    from nandoctor.child.session import WatchSession

    if options.threads:
        torch.set_num_threads(options.threads)
    session = WatchSession(options, events)
    announce_start(events, options, cuda=torch.cuda.is_available())
    keep_writes_in_scratch(options)
    install_probes_and_remedy(session, options)
    session.install()
    return session


def announce_start(events: EventWriter, options: ChildOptions, cuda: bool, **fields) -> None:
    """The run's first event: which process it is, and what it checks."""
    import torch

    events.emit("start", pid=os.getpid(), parent=os.getppid(), torch=torch.__version__,
                python=platform.python_version(),
                cuda=cuda, detect=options.detect, rank=_env_int("RANK"),
                world_size=_env_int("WORLD_SIZE"), **fields)  # fmt: skip


def keep_writes_in_scratch(options: ChildOptions) -> None:
    """A re-run: what the script writes must not touch the user's files (nandoctor's own
    folder is written as it is)."""
    if options.scratch_dir:
        from nandoctor.instrument.files import redirect_writes

        redirect_writes(options.scratch_dir, keep=(options.own_folder,))


def install_probes_and_remedy(session, options: ChildOptions) -> None:
    """The stages' probes of this run, and the fix it verifies by treatment, if any."""
    for probe in options.probes:
        _install_probe(probe, session, options)
    if options.remedy:
        from nandoctor.instrument.remedies import apply_remedy

        apply_remedy(options.remedy, session)


def _env_int(name: str) -> int | None:
    """RANK, WORLD_SIZE: set by torchrun for each process it launches."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _install_probe(stage: str, session, options: ChildOptions) -> None:
    """A stage that looks inside the run (data scan, init check) has `install_probe(session,
    options)` in its module, next to the parent-side analysis of what the probe reports."""
    import importlib

    module = importlib.import_module(f"nandoctor.stages.{stage}")
    module.install_probe(session, options)


def _seed_everything(seed: int) -> None:
    """Same seeds in every run, so runs of one script are comparable (the script's own seeding,
    if any, runs later and wins)."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def _run_script(options: ChildOptions, session, events: EventWriter) -> str:
    """Run the script as `python script.py args` would; return how it ended."""
    from nandoctor.instrument.detector import StopRun

    script = options.script
    sys.argv = [script, *options.args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if options.seed is not None:
        _seed_everything(options.seed)
    try:
        runpy.run_path(script, run_name="__main__")
    except StopRun:
        return "stopped"
    except SystemExit as exit_:
        code = exit_.code
        if code not in (None, 0):
            session.report_nonfinite_read()
            events.emit("script_exit", code=code if isinstance(code, int) else 1,
                        message=None if isinstance(code, int) else str(code))  # fmt: skip
            return "exit"
    except KeyboardInterrupt:
        return "interrupted"
    except BaseException as error:  # the user's own failure is data for the report
        if session.stopping:  # the script failed while being stopped: the stop is what counts
            return "stopped"
        session.report_nonfinite_read()  # `raise ValueError("loss is nan")` after loss.item()
        events.emit("script_error", **_describe_error(error))
        return "error"
    session.report_nonfinite_read(dying=False)  # an evaluation after the last step went NaN
    return "finished"


def _describe_error(error: BaseException) -> dict:
    """The exception with its traceback trimmed to the user's frames."""
    from nandoctor.instrument.frames import is_library_file

    frames = traceback.extract_tb(error.__traceback__)
    user_frames = [
        f
        for f in frames
        if not f.filename.startswith("<") and not is_library_file(os.path.abspath(f.filename))
    ]
    shown = traceback.format_list(user_frames[-8:])
    last = user_frames[-1] if user_frames else None
    return {
        "type": type(error).__name__,
        "message": str(error),
        "traceback": "".join(shown) + "".join(traceback.format_exception_only(type(error), error)),
        "location": {"file": os.path.abspath(last.filename), "line": last.lineno,
                     "function": last.name, "code": (last.line or "").strip()} if last else None,
    }  # fmt: skip
