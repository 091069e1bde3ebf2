"""Run the checklist of a profile on a target and build the report."""

from __future__ import annotations

import importlib
import platform
import shutil
import tempfile
import time
from collections.abc import Callable

import nandoctor
from nandoctor.child.options import ChildOptions
from nandoctor.config import Config
from nandoctor.ranking import rank_causes
from nandoctor.report.model import Report, StageResult
from nandoctor.runner import RunOutcome, run_child
from nandoctor.stages import StageContext, StageOutcome
from nandoctor.target import Target


def stage_module(name: str):
    return importlib.import_module(f"nandoctor.stages.{name}")


def watch_script(
    target: Target,
    config: Config,
    workdir: str,
    *,
    probes: list[str] | None = None,
    on_event: Callable[[dict], None] | None = None,
    show_output: bool = False,
) -> RunOutcome:
    """The watched run: the script under per-op localization and the stages' probes."""
    options = ChildOptions(
        script=target.script,
        args=list(target.args),
        events_path="",
        max_steps=config.watch.max_steps,
        seed=config.watch.seed,
        threads=config.watch.threads,
        probes=probes or [],
    )
    return run_child(
        options,
        workdir,
        timeout_s=config.watch.timeout_s,
        on_event=on_event,
        show_output=show_output,
        name="watch",
    )


def run_status(watch: RunOutcome) -> str:
    if watch.nonfinite is not None:
        return "nonfinite"
    if watch.timed_out:
        return "timeout"
    if (
        watch.interrupted
        or watch.crashed
        or watch.first("script_error")
        or watch.first("script_exit")
    ):
        return "script_error"
    return "healthy"


def describe_run(watch: RunOutcome) -> dict:
    """What the watched run saw, for the report's `run` field."""
    end = watch.end or {}
    start = watch.first("start") or {}
    error = watch.first("script_error")
    exit_event = watch.first("script_exit")
    internal = watch.first("internal_error")
    run = {
        "steps_observed": len(watch.steps),
        "backward_calls": end.get("backward_calls", 0),
        "losses": [s.get("loss") for s in watch.steps],
        "grad_norms": [s.get("grad_norm") for s in watch.steps],
        "ended": end.get("outcome") or _unfinished_reason(watch),
        "duration_s": round(watch.duration_s, 3),
        "notes": [e["text"] for e in watch.all("note")],
        "detect": start.get("detect", True),
    }
    if error:
        run["script_error"] = error
    if exit_event:
        run["script_exit"] = exit_event
    if internal:
        run["internal_error"] = internal
    if watch.crashed:
        run["output_tail"] = watch.output_tail()
    return run


def _unfinished_reason(watch: RunOutcome) -> str:
    if watch.timed_out:
        return "timeout"
    if watch.interrupted:
        return "interrupted"
    return f"crashed (exit code {watch.returncode})"


def environment(watch: RunOutcome) -> dict:
    start = watch.first("start") or {}
    return {
        "nandoctor": nandoctor.__version__,
        "python": start.get("python", platform.python_version()),
        "torch": start.get("torch"),
        "cuda_available": start.get("cuda"),
        "threads": start.get("threads"),
        "platform": platform.platform(),
    }


def run_stages(context: StageContext, stages: tuple[str, ...], progress) -> None:
    for name in stages:
        progress(f"{name}…")
        started = time.monotonic()
        try:
            outcome = stage_module(name).run(context)
        except Exception as error:  # one stage's failure must not cost the others their say
            outcome = StageOutcome(StageResult("failed", f"{type(error).__name__}: {error}"))
        # A stage that reads the watched run counts that run's time as its own.
        outcome.result.duration_s = (outcome.result.duration_s or 0.0) + time.monotonic() - started
        context.earlier[name] = outcome


def diagnose(
    target: Target,
    config: Config,
    *,
    progress: Callable[[str], None] = lambda text: None,
    on_event: Callable[[dict], None] | None = None,
    show_output: bool = False,
    keep_workdir: bool = False,
) -> Report:
    workdir = tempfile.mkdtemp(prefix="nandoctor-")
    try:
        probes = [s for s in config.stages if getattr(stage_module(s), "PROBE", False)]
        progress("watching the script…")
        watch = watch_script(target, config, workdir, probes=probes, on_event=on_event,
                             show_output=show_output)  # fmt: skip
        context = StageContext(target, config, workdir, watch, progress=progress)
        run_stages(context, config.stages, progress)
        return build_report(target, watch, context)
    finally:
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def build_report(target: Target, watch: RunOutcome, context: StageContext) -> Report:
    findings = [f for outcome in context.earlier.values() for f in outcome.findings]
    status = run_status(watch)
    anomaly = context.earlier.get("anomaly")
    first = anomaly.first_nonfinite if anomaly else None
    return Report(
        script_path=target.script,
        script_args=list(target.args),
        status=status,
        first_nonfinite=first,
        # The schema's contract: no causes for a healthy run. What stages flagged anyway is
        # kept as findings (warnings in the report), never promoted to a cause.
        causes=[] if status == "healthy" else rank_causes(findings),
        stages={name: outcome.result for name, outcome in context.earlier.items()},
        environment=environment(watch),
        run=describe_run(watch),
        findings=findings,
    )
