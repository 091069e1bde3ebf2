"""Run the checklist of a profile on a target and build the report."""

from __future__ import annotations

import dataclasses
import importlib
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable

import nandoctor
from nandoctor import interrupts
from nandoctor.child.events import first_event, read_events
from nandoctor.clipping import ineffective_clip_findings
from nandoctor.compiled_only import eager_rerun_event, kept_compiled, stayed_finite_through
from nandoctor.config import Config
from nandoctor.distributed import primary_rank, rank_summaries
from nandoctor.instrument.kinds import (
    CONSTANT_OVERFLOW,
    CONVERSION_OVERFLOW,
    DIVISION_BY_ZERO,
    DOMAIN,
)
from nandoctor.instrument.precision import REDUCED_DTYPES
from nandoctor.optimizer_settings import line_search_findings, settings_findings
from nandoctor.ranking import (
    RunFacts,
    apply_causal_rules,
    apply_verified_rules,
    at_the_clip_setting,
    at_the_precision_setting,
    at_the_producing_line,
    at_the_written_value,
    rank_causes,
)
from nandoctor.recurrence import hand_updated_recurrence_finding
from nandoctor.report.model import Location, Report, StageResult
from nandoctor.rewind import (
    FROM_THE_START,
    Start,
    live_points,
    offer_fresh_starts,
    release,
    start_for,
)
from nandoctor.runner import (
    RunOutcome,
    read_rerun_log,
    rerun_options,
    rerun_timeout_s,
    run_child,
    script_options,
)
from nandoctor.source_values import casts_explicitly, clip_switched_off
from nandoctor.stages import StageContext, StageOutcome, anomaly
from nandoctor.stages.lr_sweep import rules_out_the_rate
from nandoctor.target import Target
from nandoctor.verify import verify_findings


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
    progress: Callable[[str], None] = lambda text: None,
) -> RunOutcome:
    """The watched run, with the stages' probes. With `localize: replay` it watches at full
    speed and, when a NaN/Inf shows up at step K, replays the script with per-op localization
    from step K-1; the replay's finding replaces the cheap one when it reproduces. Replays run
    torch.compile'd code eagerly: a failure they do not reproduce appeared only compiled."""
    always = config.watch.localize == "always"
    options = _watch_options(target, config, probes or [], detect=always)
    watch = run_child(options, workdir, timeout_s=config.watch.timeout_s, on_event=on_event,
                      show_output=show_output, name="watch")  # fmt: skip
    offer_fresh_starts(watch.events)
    failure = watch.nonfinite
    if always or failure is None:
        return watch
    from_step = max(0, failure["step"] - 1)
    progress(f"replaying step {failure['step']} with per-op checks…")
    # From a point at or before step K-1, per-op checks see what a replay from step 0 sees:
    # they switch on at step K-1 either way. A point taken right before step K serves too,
    # unless the value was already non-finite when its checks began.
    start = start_for(watch.events, latest=failure["step"])
    replay = _replay(target, config, workdir, watch, from_step=from_step, start=start)
    if start.step > from_step and _made_before_the_checks(replay):
        why = (f"from step 0: the NaN/Inf was already in a tensor when the replay resumed at "
               f"step {start.step}, after step {from_step} where per-op checks begin")  # fmt: skip
        replay = _replay(target, config, workdir, watch, from_step=from_step,
                         start=Start(None, why))  # fmt: skip
    if replay.interrupted:
        watch.interrupted = True
        return watch
    if _reproduces(replay, failure):
        return _noting_eager_replay(_with_localization(watch, replay, "replayed"))
    if kept_compiled(watch) and stayed_finite_through(replay, failure["step"]):
        return _only_compiled(watch, replay)  # a replay from step 0 would run eagerly too
    if from_step > 0 and not _broken(replay):
        progress("the replay differed; localizing with per-op checks from the start…")
        replay = _replay(target, config, workdir, watch, from_step=0, start=FROM_THE_START)
        if replay.nonfinite is not None and replay.nonfinite.get("birth"):
            located = _with_localization(watch, replay, "from the start")
            return _noting_eager_replay(located)
    watch.events.append({"event": "note", "text": _unlocalized_reason(replay, failure, watch)})
    return watch


def _made_before_the_checks(replay: RunOutcome) -> bool:
    """The replay's birth is a tensor that was non-finite before its per-op checks began, with
    no record of where it entered torch (`torch.from_numpy` and the like are recorded)."""
    birth = (replay.nonfinite or {}).get("birth") or {}
    return bool(birth.get("inputs_nonfinite")) and str(birth.get("op", "")).startswith("aten.")


def _broken(run: RunOutcome) -> bool:
    return run.first("internal_error") is not None or run.crashed


def _noting_eager_replay(watch: RunOutcome) -> RunOutcome:
    if kept_compiled(watch):
        step = watch.nonfinite["step"]
        watch.events.append({"event": "note", "text": (
            f"the script uses torch.compile: the replay that localized step {step} ran it "
            "eagerly (compile disabled) so that per-op checks see every op, and so do re-runs "
            "that verify a fix; the watched run kept it compiled")})  # fmt: skip
    return watch


def _only_compiled(watch: RunOutcome, eager: RunOutcome) -> RunOutcome:
    """The watched run compiled and failed at step K; the eager replay got through step K
    finite. Its losses go with the watched run, for the device comparison."""
    step = watch.nonfinite["step"]
    watch.events.append(eager_rerun_event(eager, kept_compiled(watch)))
    watch.events.append({"event": "note", "text": (
        f"the failure at step {step} appears only when compiled: the script run eagerly "
        f"(torch.compile disabled, same seed) stayed finite through step {step}, so per-op "
        "checks, which need the eager ops, could not localize it; device_compare compares "
        "the compiled and the eager run")})  # fmt: skip
    return watch


def _unlocalized_reason(replay: RunOutcome, failure: dict, watch: RunOutcome) -> str:
    if internal := replay.first("internal_error"):
        return f"the localizing replay could not start ({internal['text']})"
    if replay.crashed:
        return f"the localizing replay crashed (exit code {replay.returncode})"
    if kept_compiled(watch):
        found = replay.nonfinite
        instead = f", which went non-finite at step {found['step']}" if found else ""
        return (
            f"the failure at step {failure['step']} did not reproduce in the eager replay "
            f"(torch.compile disabled, same seed){instead}: compiled kernels compute "
            "differently, so its origin could not be localized; `watch.localize: always` "
            "watches and localizes the eager run instead"
        )
    return (
        f"the failure at step {failure['step']} did not reproduce in a second run with the "
        "same seed (the script is not deterministic), so its origin could not be localized; "
        "try `watch.localize: always`"
    )


def _watch_options(target: Target, config: Config, probes: list[str], detect: bool):
    """The watched run: the user's own files, with the probes of the selected stages."""
    extra = {s: stage_module(s).probe_settings(config) for s in probes
             if hasattr(stage_module(s), "probe_settings")}  # fmt: skip
    rewind = dataclasses.asdict(config.rewind) if _rewinds(target, config) else None
    return script_options(target, config, probes=probes, detect=detect, extra=extra,
                          rewind=rewind)  # fmt: skip


def _rewinds(target: Target, config: Config) -> bool:
    """Keep rewind points when a re-run may follow: a replay, a sweep, a comparison or a fix
    verification (the quick profile makes none)."""
    reruns = (
        config.watch.localize == "replay"
        or config.verify.max_fixes > 0
        or any(stage in config.stages for stage in ("lr_sweep", "device_compare"))
    )
    return config.rewind.enabled and reruns and target.nproc_per_node <= 1


def _replay(
    target: Target, config: Config, workdir: str, watch: RunOutcome, from_step: int, start: Start
) -> RunOutcome:
    """Run the script again with per-op checks from `from_step`, up to the watched failure,
    starting at `start` (a rewind point or step 0)."""
    options = rerun_options(target, config, workdir, "replay", detect=True,
                            detect_from_step=from_step)  # fmt: skip
    # per-op checks cost up to a few times a plain step: the limit allows for them
    timeout_s = rerun_timeout_s(config, watch, 2 * (watch.nonfinite["step"] + 1 - start.step))
    # one name per replay: each run's files (events, log) are its own
    name = f"replay-from-{from_step}" + (f"-resumed-at-{start.step}" if start.point else "")
    return run_child(options, workdir, timeout_s=timeout_s, name=name, start=start)


def _reproduces(replay: RunOutcome, failure: dict) -> bool:
    # Of a torchrun launch, any rank counts: per-op checks tell the rank that made the value
    # from those that received it through a collective, which the cheap watch cannot.
    found = replay.nonfinite
    return found is not None and found["step"] == failure["step"] and found.get("birth") is not None


def _with_localization(watch: RunOutcome, replay: RunOutcome, how: str) -> RunOutcome:
    """The watched run's events with the cheap NaN/Inf event replaced by the replay's localized
    one; of a torchrun launch, every rank's, and which rank made it first is decided again."""
    if not watch.ranks:
        events = _relocalized(watch.events, replay.nonfinite, how)
        return dataclasses.replace(watch, events=events)
    ranks = {rank: _relocalized(events, first_event(replay.ranks.get(rank, []), "nonfinite"), how)
             for rank, events in watch.ranks.items()}  # fmt: skip
    rank = primary_rank(ranks)  # localized births tell made from received
    return dataclasses.replace(watch, events=ranks[rank], ranks=ranks, rank=rank)


def _relocalized(events: list[dict], located: dict | None, how: str) -> list[dict]:
    """`events` with their NaN/Inf event replaced by the replay's localized one. What the watch
    saw stays when the replay did not localize it, and the watch's clock (`t`) stays too: it
    orders the ranks of one launch."""
    seen = first_event(events, "nonfinite")
    if seen is None or located is None or located.get("birth") is None:
        return events
    return [{**located, "localized": how, "t": seen.get("t")} if e is seen else e for e in events]


def run_status(watch: RunOutcome) -> str:
    if watch.nonfinite is not None:
        return "nonfinite"
    if watch.timed_out:
        return "timeout"
    if watch.first("budget_reached") is not None:
        return "inconclusive"  # the script did not end: what came after was never seen
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
    error = watch.first("script_error")
    exit_event = watch.first("script_exit")
    internal = watch.first("internal_error")
    budget = watch.first("budget_reached")
    run = {
        "steps_observed": len(watch.steps),
        "backward_calls": end.get("backward_calls", 0),
        "losses": watch.losses,
        "grad_norms": watch.grad_norms,
        "ended": end.get("outcome") or _unfinished_reason(watch),
        "duration_s": round(watch.duration_s, 3),
        "notes": [e["text"] for e in watch.all("note")],
        "localized": (
            watch.nonfinite.get("localized", "in the watched run") if watch.nonfinite else None
        ),
    }
    if budget:
        run["budget"] = {"name": budget["budget"], "steps": budget["steps"]}
    if died := watch.diverged_then_died:
        run["diverged"] = {"step": died[0], "evidence": died[1]}
    if recurrent := watch.all("recurrent"):  # weights applied again and again to their output
        run["recurrent"] = [{key: e[key] for key in ("module", "type", "chain")} for e in recurrent]
    if precisions := watch.all("precision"):  # what each model computed in, from which step
        run["precisions"] = [{key: e[key] for key in _PRECISION_FIELDS} for e in precisions]
    if watch.ranks:
        run["ranks"] = rank_summaries(watch.ranks, watch.rank)
    if error:
        run["script_error"] = error
    if exit_event:
        run["script_exit"] = exit_event
    if internal:
        run["internal_error"] = internal
    if watch.crashed:
        run["output_tail"] = watch.output_tail()
    return run


_PRECISION_FIELDS = ("module", "step", "param_dtypes", "autocast", "tf32")


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
        "threads": (watch.end or {}).get("threads"),
        "world_size": start.get("world_size"),
        "platform": platform.platform(),
    }


def run_stages(context: StageContext, stages: tuple[str, ...], progress) -> bool:
    """Run the stages in order; False when the user interrupted (Ctrl-C) and the rest were
    skipped. A stage that fails is recorded as failed; the others still run."""
    interrupted = context.watch.interrupted
    for name in stages:
        if interrupted:
            context.earlier[name] = StageOutcome(StageResult("skipped", _interrupted()))
            continue
        progress(f"{name}…")
        started = time.monotonic()
        try:
            outcome = stage_module(name).run(context)
        except KeyboardInterrupt:
            interrupted = True
            outcome = StageOutcome(StageResult("failed", _interrupted()))
        except Exception as error:  # one stage's failure must not cost the others their say
            outcome = StageOutcome(StageResult("failed", f"{type(error).__name__}: {error}"))
        # A stage that reads the watched run counts that run's time as its own.
        outcome.result.duration_s = (outcome.result.duration_s or 0.0) + time.monotonic() - started
        context.earlier[name] = outcome
    return not interrupted


def _interrupted() -> str:
    return f"interrupted ({interrupts.received() or 'Ctrl-C'})"


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
    watch = None
    try:
        probes = [s for s in config.stages if getattr(stage_module(s), "PROBE", False)]
        progress("watching the script…")
        watch = watch_script(target, config, workdir, probes=probes, on_event=on_event,
                             show_output=show_output, progress=progress)  # fmt: skip
        context = StageContext(target, config, workdir, watch, progress=progress)
        completed = run_stages(context, config.stages, progress)
        findings = [f for outcome in context.earlier.values() for f in outcome.findings]
        findings += settings_findings(watch.all("optimizer"))
        findings += line_search_findings(watch.all("optimizer"), watch.nonfinite is not None)
        findings += ineffective_clip_findings(watch.all("gradient_clip"), watch.failed_step)
        if recurrence := hand_updated_recurrence_finding(watch, config.lr_sweep):
            findings.append(recurrence)
        sweep = context.earlier.get("lr_sweep")
        rate_ruled_out = rules_out_the_rate(sweep.result if sweep else None)
        if rate_ruled_out:
            findings = anomaly.without_the_rate(context, findings, rate_ruled_out)
        try:
            facts = dataclasses.replace(run_facts(watch), rate_ruled_out=rate_ruled_out)
            findings = apply_causal_rules(findings, facts)
            if completed:
                clip_off = clip_switched_off(target.absolute_script, tuple(target.args))
                findings = apply_verified_rules(verify_findings(context, findings), clip_off)
            hand_updated_in = target.absolute_script if watch.updates_by_hand else None
            findings = at_the_written_value(findings, target.args, hand_updated_in,
                                            _the_optimizer_with_a_rate(watch))  # fmt: skip
            findings = at_the_clip_setting(findings, target.absolute_script, target.args,
                                           facts.backward_call)  # fmt: skip
            findings = at_the_precision_setting(findings, target.absolute_script, target.args,
                                                facts)  # fmt: skip
            findings = at_the_producing_line(findings, watch.all("numpy_error"), watch.failed_step)
        except KeyboardInterrupt:  # the report is written with what the stages found
            completed = False
        report = build_report(target, watch, context, findings)
        report.run.update(rewind_summary(watch, read_rerun_log(workdir)))
        if not completed:
            report.run["ended"] = "interrupted"
        if report.run["ended"] == "interrupted":
            report.run["interrupted_by"] = interrupts.received() or "SIGINT"
        return report
    finally:
        release(watch.events if watch is not None else _watch_events(workdir))
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _the_optimizer_with_a_rate(watch: RunOutcome) -> Location | None:
    """Where the run's optimizers with a learning rate were built, when that is one place."""
    places = {(o["location"]["file"], o["location"]["line"]): o["location"]
              for o in watch.all("optimizer") if o.get("has_rate") and o.get("location")}  # fmt: skip
    return Location.from_dict(next(iter(places.values()))) if len(places) == 1 else None


def _watch_events(workdir: str) -> list[dict]:
    """The watched run's events as far as they got (an interrupted watch returns none)."""
    return read_events(os.path.join(workdir, "watch.events.jsonl"))[0]


def rewind_summary(watch: RunOutcome, reruns: list[dict]) -> dict:
    """For the report's `run`: the rewind points kept, why none could be, and where each
    re-run started."""
    refused = watch.first("rewind_refused")
    summary = {"reruns": reruns}
    if points := live_points(watch.events):
        summary["rewind_points"] = [point.step for point in points]
    if refused is not None:
        summary["rewind_refused"] = {"step": refused["step"], "reason": refused["reason"]}
    return summary


def run_facts(watch: RunOutcome) -> RunFacts:
    optimizers = watch.all("optimizer")
    autocast = _reducing_autocast(watch)
    return RunFacts(
        failed_step=watch.failed_step,
        failed_in_the_update=(watch.nonfinite or {}).get("phase") == "optimizer",
        losses=tuple(watch.losses),
        grad_norms=tuple(watch.grad_norms),
        optimizer_location=Location.from_dict(optimizers[0].get("location"))
        if optimizers
        else None,
        loss_scale=watch.first("loss_scaled"),
        backward_call=Location.from_dict((watch.nonfinite or {}).get("backward_call")),
        autocast=autocast,
        dtype_breaks_the_formula=autocast is not None
        and _dtype_breaks_the_formula((watch.nonfinite or {}).get("birth")),
    )


def _dtype_breaks_the_formula(birth: dict | None) -> bool:
    """The first NaN/Inf, computed below float32, is a domain error or a division by zero
    (rounding put a value on the op's edge: an eps of 1e-8 is 0 in float16), a constant of its
    formula the dtype cannot hold (`scores * -1e9`), or the script's own cast of a value the
    dtype cannot hold (`torch.where(mask, 0.0, -1e10).to(scores.dtype)`).
    Values that grew past the dtype's range, or autocast's own conversions, are not. Asked only
    under autocast: there the tensors stay float32 and the op alone computes in half, so what
    rounds away is the op's own; a model and data cast to half lose values wherever they are
    cast, and the precision setting is what to change."""
    if not birth or birth.get("dtype") not in REDUCED_DTYPES:
        return False
    kind = birth.get("kind")
    if kind in (DOMAIN, DIVISION_BY_ZERO, CONSTANT_OVERFLOW):
        return True
    location = birth.get("location") or {}
    return (
        kind == CONVERSION_OVERFLOW
        and location.get("file") is not None
        and casts_explicitly(location["file"], location.get("line") or 0)
    )


def _reducing_autocast(watch: RunOutcome) -> dict | None:
    """The first float16/bfloat16 autocast region, when the models' own weights are float32
    (the region, not a `.half()`, made the reduced precision)."""
    if any(d in REDUCED_DTYPES for e in watch.all("precision") for d in e["param_dtypes"]):
        return None
    return next((e for e in watch.all("autocast") if e.get("dtype") in REDUCED_DTYPES), None)


# Statuses of runs that saw no NaN/Inf and no failure: causes need a failure to explain.
_NOTHING_NONFINITE = ("healthy", "inconclusive")


def build_report(
    target: Target, watch: RunOutcome, context: StageContext, findings: list
) -> Report:
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
        causes=[] if status in _NOTHING_NONFINITE else rank_causes(findings),
        stages={name: outcome.result for name, outcome in context.earlier.items()},
        environment=environment(watch),
        run=describe_run(watch),
        findings=findings,
    )
