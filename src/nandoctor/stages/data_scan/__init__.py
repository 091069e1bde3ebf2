"""Data scan stage: do the batches themselves carry NaN/Inf, absurd magnitudes, all-zero or
constant samples, or class targets outside [0, C)? And exactly where: step, batch position,
sample, feature, dataset index, and the line of `Dataset.__getitem__` that made the value."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nandoctor.report.model import Finding, StageResult
from nandoctor.stages import StageContext, StageOutcome
from nandoctor.stages.data_scan import provenance
from nandoctor.stages.data_scan.findings import (
    NAME,
    constant_finding,
    first_bad_kinds,
    located_origin,
    magnitude_finding,
    nonfinite_finding,
    target_findings,
)

PROBE = True


@dataclass(frozen=True)
class Settings:
    """Settings of this stage (the `data_scan:` section of a profile)."""

    magnitude_threshold: float = 1.0e4  # |x| above this in a floating batch tensor is flagged
    # In a run that failed, a floating batch tensor whose root-mean-square is above this (raw
    # pixel values, counts, prices) gets a re-run with that tensor standardized.
    scale_threshold: float = 100.0
    max_positions: int = 8  # sample, feature and dataset indices listed per problem
    max_leaves: int = 64  # tensor leaves summarized per batch (nested batches)
    forward_calls_per_step: int = 4  # root-module forward calls per step whose inputs are scanned
    origin_refetches: int = 1  # bad samples fetched again under a line tracer to find the line
    search_script_globals: bool = True  # name the script's tensor that holds the bad rows
    # When the batch only carried values made before training (a Dataset serving `self.x[i]`,
    # a `torch.from_numpy` before the loop), re-run the script from its start under a line
    # tracer until training begins, to find the line that made them.
    trace_where_made: bool = True


def probe_settings(config) -> dict:
    return dataclasses.asdict(config.data_scan)


def install_probe(session, options) -> None:
    if (request := options.extra.get(provenance.REQUEST)) is not None:
        provenance.install(session, request)  # a re-run that only traces where data was made
        return
    from nandoctor.stages.data_scan.probe import DataScanProbe

    DataScanProbe(session, Settings(**options.extra.get(NAME, {}))).install()


def run(context: StageContext) -> StageOutcome:
    watch = context.watch
    batches, targets = watch.all("data_batch"), watch.all("data_targets")
    if not batches and not targets:
        summary = "no batch seen: no DataLoader batch and no tensor input to a model"
        return StageOutcome(StageResult("ran", summary))
    settings = context.config.data_scan
    failed = watch.nonfinite is not None
    details = _details(batches)
    findings = [
        f
        for f in (
            _traced(context, nonfinite_finding(watch, batches), first_bad_kinds(batches)),
            *target_findings(watch, targets),
            magnitude_finding(batches, settings, failed, details["tensors"]),
            constant_finding(batches),
        )
        if f is not None
    ]
    result = StageResult("ran", _summary(batches, targets, findings), details=details)
    return StageOutcome(result, findings)


def _traced(context: StageContext, finding: Finding | None, kinds: list[str]) -> Finding | None:
    """A NaN/Inf finding that explains the failure, moved to the line that made the values
    when the batch only carried values made before training."""
    if finding is None or not context.config.data_scan.trace_where_made:
        return finding
    request = provenance.request_for(
        finding, located_origin(context.watch), context.target.absolute_script
    )
    if request is None:
        return finding
    return provenance.traced_to_where_made(context, finding, {**request, "kinds": kinds})


def _summary(batches: list[dict], targets: list[dict], findings: list[Finding]) -> str:
    loader = sum(1 for e in batches if e["source"] == "loader")
    parts = [f"{loader} DataLoader batches"] if loader else []
    if len(batches) > loader:
        parts.append(f"{len(batches) - loader} model inputs")
    text = " and ".join(parts or ["nothing"]) + " scanned"
    if targets:
        text += f", class targets of {len(targets)} loss calls checked"
    notes = [f.title + (" (hint)" if f.severity == "hint" else "") for f in findings]
    if notes:
        return f"{text}: {'; '.join(notes)}"
    return f"{text}: no NaN/Inf" + (", class targets in range" if targets else "")


def _details(batches: list[dict]) -> dict:
    """Per tensor path (at most 32), the range of its values over all scanned batches."""
    tensors: dict[str, dict] = {}
    for event in batches:
        for leaf in event["leaves"]:
            path = leaf["path"]
            if leaf.get("min") is None or (len(tensors) >= 32 and path not in tensors):
                continue
            entry = tensors.setdefault(path, {"dtype": leaf["dtype"], "batches": 0})
            entry["batches"] += 1
            entry["min"] = min(entry.get("min", leaf["min"]), leaf["min"])
            entry["max"] = max(entry.get("max", leaf["max"]), leaf["max"])
            entry.update(shape=leaf["shape"], mean=leaf["mean"], std=leaf["std"])
            entry["nonfinite_batches"] = entry.get("nonfinite_batches", 0) + bool(
                leaf.get("bad_at")
            )
    return {"batches": len(batches), "tensors": tensors}
