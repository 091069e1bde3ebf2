"""Optimizer settings far outside any sensible range are findings in their own right: a typo
(`lr=5e5` for 5e-5, `weight_decay=1000`) explains a failure better than any op it reaches.

The ranges are those no recipe uses, not tuned thresholds: a learning rate above 1 for an
adaptive optimizer (their steps are about `lr` per parameter, whatever the gradient), momentum
or betas outside [0, 1), a negative eps or learning rate, weight decay above 1 (a weight shrinks
by lr x weight_decay of itself per step: typical values are 1e-4 to 1e-1).
"""

from __future__ import annotations

from nandoctor.report.model import Finding, Location

# Adaptive optimizers whose per-parameter step is about lr: above 1, every weight moves by
# more than 1 each step. (Adadelta, whose default lr is 1.0, scales differently: not listed.)
_ADAPTIVE = {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop", "SparseAdam"}
_MAX_ADAPTIVE_LR = 1.0
_MAX_WEIGHT_DECAY = 1.0
# What a verification run puts in place of an absurd value.
_SANE = {"lr": 1e-3, "weight_decay": 1e-2, "momentum": 0.9, "betas": [0.9, 0.999], "eps": 1e-8}


def absurd_settings(optimizer: dict) -> dict[str, str]:
    """The settings of one recorded optimizer (an `optimizer` event) that no recipe uses, each
    with the reason."""
    kind, settings = optimizer["type"], optimizer.get("settings", {})
    found = {}
    lr = _number(settings.get("lr"))
    if lr is not None and lr < 0:
        found["lr"] = f"lr={lr:g} is negative: every step climbs the loss"
    elif lr is not None and kind in _ADAPTIVE and lr > _MAX_ADAPTIVE_LR:
        found["lr"] = (f"lr={lr:g} for {kind}, whose steps move each weight by about lr: "
                       "sensible values are 1e-5 to 1e-2")  # fmt: skip
    weight_decay = _number(settings.get("weight_decay"))
    if weight_decay is not None and weight_decay > _MAX_WEIGHT_DECAY:
        found["weight_decay"] = (f"weight_decay={weight_decay:g}: sensible values are 1e-4 to "
                                 "1e-1 (each step shrinks a weight by lr x weight_decay of itself)")  # fmt: skip
    momentum = _number(settings.get("momentum"))
    if momentum is not None and not 0 <= momentum < 1:
        found["momentum"] = f"momentum={momentum:g} is outside [0, 1): the velocity never decays"
    betas = settings.get("betas")
    if isinstance(betas, list) and any(not 0 <= (_number(b) or 0) < 1 for b in betas):
        found["betas"] = f"betas={tuple(betas)} lie outside [0, 1): the moment estimates grow"
    eps = _number(settings.get("eps"))
    if eps is not None and eps < 0:
        found["eps"] = f"eps={eps:g} is negative: the update can divide by zero or flip sign"
    return found


def settings_findings(optimizers: list[dict]) -> list[Finding]:
    """One finding per optimizer with absurd settings: `learning_rate` when the learning rate
    is all that is off, `optimizer_config` otherwise; located at the constructor call."""
    findings = []
    for optimizer in optimizers:
        absurd = absurd_settings(optimizer)
        if not absurd:
            continue
        names = ", ".join(absurd)
        category = "learning_rate" if set(absurd) == {"lr"} else "optimizer_config"
        code = "LR602" if category == "learning_rate" else "OC602"
        replacement = {name: _SANE[name] for name in absurd}
        findings.append(
            Finding(
                stage="diagnosis",
                category=category,
                title=f"{optimizer['type']} is built with {names} far outside any sensible range",
                confidence=0.9,
                evidence=tuple(absurd.values()),
                fix=f"set {describe_settings(replacement, quote='`')} where {optimizer['type']} is built "
                f"(a typo in an exponent is the usual story)",
                location=Location.from_dict(optimizer.get("location")),
                remedy={
                    "kind": "optimizer_settings",
                    "index": optimizer.get("index"),
                    "settings": replacement,
                },  # fmt: skip
                code=code,
            )
        )
    return findings


def line_search_findings(optimizers: list[dict], failed: bool) -> list[Finding]:
    """An L-BFGS without a line search takes its quasi-Newton step at full length (lr=1 by
    default): one poor curvature estimate gives a huge step. In a run that failed, its re-run
    with a strong-Wolfe line search is the evidence (torch's docs recommend one)."""
    if not failed:
        return []
    return [
        Finding(
            stage="diagnosis",
            category="optimizer_config",
            title=f"{optimizer['type']} takes full quasi-Newton steps without a line search",
            confidence=0.6,
            evidence=(
                f"{optimizer['type']} is built with line_search_fn=None: each step is "
                f"lr={optimizer['settings'].get('lr', 1):g} times the quasi-Newton "
                "direction, however poor the curvature estimate",
            ),  # fmt: skip
            fix=f'build {optimizer["type"]} with `line_search_fn="strong_wolfe"`',
            location=Location.from_dict(optimizer.get("location")),
            remedy={
                "kind": "optimizer_settings",
                "index": optimizer.get("index"),
                "settings": {"line_search_fn": "strong_wolfe"},
            },  # fmt: skip
            code="OC603",
        )
        for optimizer in optimizers
        if optimizer["type"] == "LBFGS"
        and "line_search_fn" in optimizer.get("settings", {})
        and optimizer["settings"]["line_search_fn"] is None
    ]


def describe_settings(settings: dict, quote: str = "") -> str:
    """`weight_decay=0.01, betas=(0.9, 0.999)`: settings as they are written in Python, each
    between `quote`s."""
    return ", ".join(f"{quote}{name}={_literal(value)}{quote}" for name, value in settings.items())


def _literal(value) -> str:
    if isinstance(value, str):
        return repr(value)
    return str(tuple(value)) if isinstance(value, list) else f"{value:g}"


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
