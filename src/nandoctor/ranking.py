"""Rank findings into causes: deterministic, explicit order."""

from __future__ import annotations

from nandoctor.report.model import Cause, Finding

_SEVERITY_ORDER = {"error": 0, "warning": 1}


def rank_causes(findings: list[Finding]) -> list[Cause]:
    """Errors and warnings become causes (hints never do); a verified fix outranks a guess, then
    confidence decides; one cause per (category, location), keeping the strongest."""
    candidates = [f for f in findings if f.severity in _SEVERITY_ORDER]
    ordered = sorted(
        candidates,
        key=lambda f: (
            0 if f.verified_fix else 1,
            -f.confidence,
            _SEVERITY_ORDER[f.severity],
            f.category,
            f.title,
        ),
    )
    causes: list[Cause] = []
    seen: set[tuple] = set()
    for finding in ordered:
        key = (finding.category, finding.location.short() if finding.location else None)
        if key in seen:
            continue
        seen.add(key)
        causes.append(
            Cause(
                rank=len(causes) + 1,
                category=finding.category,
                title=finding.title,
                confidence=round(finding.confidence, 2),
                evidence=finding.evidence,
                fix=finding.fix,
                location=finding.location,
                verified_fix=finding.verified_fix,
                stage=finding.stage,
            )
        )
    return causes
