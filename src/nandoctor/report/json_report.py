"""The JSON report (schema_version 1, see report-schema.json in this folder)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from nandoctor.report.model import Cause, Finding, FirstNonfinite, Location, Report

SCHEMA_PATH = Path(__file__).with_name("report-schema.json")


def _location(location: Location | None) -> dict | None:
    if location is None:
        return None
    data = {"file": location.file, "line": location.line}
    if location.function:
        data["function"] = location.function
    if location.code is not None:
        data["code"] = location.code
    return data


def _first_nonfinite(first: FirstNonfinite | None) -> dict | None:
    if first is None:
        return None
    data = asdict(first)
    data["location"] = _location(first.location)
    if first.rank is None:  # a single-process run has no ranks
        del data["rank"]
    return data


def _cause(cause: Cause) -> dict:
    data = asdict(cause)
    data["evidence"] = list(cause.evidence)
    data["location"] = _location(cause.location)
    if cause.verified_fix is None:
        del data["verified_fix"]
    return data


def _finding(finding: Finding) -> dict:
    data = asdict(finding)
    data.pop("remedy", None)
    data["evidence"] = list(finding.evidence)
    data["location"] = _location(finding.location)
    return data


def _finite(value):
    """JSON has no NaN/Inf: readers of the report get null (or a string for a label)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def report_to_dict(report: Report) -> dict:
    stages = {}
    for name, stage in report.stages.items():
        entry = {"status": stage.status, "summary": stage.summary, **stage.details}
        if stage.duration_s is not None:
            entry["duration_s"] = round(stage.duration_s, 3)
        stages[name] = entry
    return _finite(
        {
            "schema_version": 1,
            "script": {"path": report.script_path, "args": list(report.script_args)},
            "status": report.status,
            "first_nonfinite": _first_nonfinite(report.first_nonfinite),
            "causes": [_cause(c) for c in report.causes],
            "stages": stages,
            "environment": report.environment,
            "run": report.run,
            "findings": [_finding(f) for f in report.findings],
        }
    )


def write_json(report: Report, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report_to_dict(report), indent=2) + "\n", encoding="utf-8")
