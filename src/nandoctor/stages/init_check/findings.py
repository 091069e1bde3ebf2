"""The init check's findings for one model, from its `ModelCheck` measurements."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace

from nandoctor.report.model import Finding, Location
from nandoctor.source_values import written_value_origin
from nandoctor.stages.init_check.analysis import ModelCheck

NAME = "init_check"

_CONFIDENCE = {"error": 0.9, "warning": 0.7, "hint": 0.4}
_RELU_LIKE = {"ReLU", "LeakyReLU", "GELU", "SiLU", "ELU", "ReLU6", "Mish"}


def model_findings(check: ModelCheck) -> list[Finding]:
    scale = scale_finding(check)
    found = [
        scale,
        _nonfinite_weights(check),
        _bias_finding(check),
        _embedding_finding(check),
        _recurrent_finding(check),
        _norm_finding(check),
    ]
    if scale is None and (level := check.loss_level()) != "fine":
        found.append(_loss_finding(check, level))
    return [f for f in found if f is not None]


# ---- weights off scale and activation growth --------------------------------------------------
def _severity(check: ModelCheck, flagged: list) -> str:
    """error: growth past the error thresholds, or off-scale weights plus a non-finite first
    forward or starting loss; warning: growth past the warning thresholds, kappa past
    `kappa_error` with no norm after the layer; hint: off-scale weights nothing confirms."""
    s, loss = check.settings, check.loss_level()
    if (
        check.growth >= s.growth_error
        or check.chain >= s.layer_gain_error
        or (flagged and (check.nonfinite is not None or loss == "error"))
    ):
        return "error"
    growing = check.growth >= s.growth_warn or check.chain >= s.layer_gain_warn
    unguarded = any(
        w["kappa"] > s.kappa_error and not check.followed_by_norm(layer["name"])
        for layer, w in flagged
    )
    if growing or unguarded or (flagged and loss == "warning"):
        return "warning"
    return "hint"


def scale_finding(check: ModelCheck) -> Finding | None:
    s, flagged = check.settings, check.flagged()
    growing = check.growth >= s.growth_warn or check.chain >= s.layer_gain_warn
    if not flagged and not growing:
        return None
    severity = _severity(check, flagged)
    names = [layer["name"] for layer, _ in flagged] or check.chain_names or [check.growth_at]
    ratios = [w["kappa"] / w["default_kappa"] for _, w in flagged]
    if flagged:
        location = most_common_write([w for _, w in flagged])
        title = (
            f"weights of {names_of(names)} are {statistics.median(ratios):.0f}x the PyTorch "
            f"default scale (kappa up to {max(w['kappa'] for _, w in flagged):.3g})"
        )
    else:
        location = most_common_write([w for layer, w in check.weights() if layer["name"] in names])
        growth = max(check.growth, check.chain)
        title = f"activations grow x{growth:.3g} through {names_of(names)} at init"
    return Finding(
        stage=NAME,
        category="initialization",
        title=title,
        confidence=_CONFIDENCE[severity],
        evidence=tuple(_scale_evidence(check, flagged, location)),
        fix=_scale_fix(check, names, ratios, location),
        location=location,
        severity=severity,
        remedy=_reinitialize([layer for layer, _ in flagged], location),
        code="IN301",
    )


def _reinitialize(layers: list[dict], location: Location | None) -> dict | None:
    """Verify "use the default init" by re-running with `reset_parameters()` at the first
    forward; not when the weights were set by a `reset_parameters` override, which that would
    only repeat."""
    if not layers or (location is not None and location.function == "reset_parameters"):
        return None
    return {
        "kind": "reinitialize",
        "modules": list(dict.fromkeys(layer["module"] for layer in layers)),
    }


def _scale_evidence(check: ModelCheck, flagged: list, location: Location | None) -> list[str]:
    evidence = [describe_weight(layer, w) for layer, w in flagged[:8]]
    if len(flagged) > 8:
        evidence.append(f"... and {len(flagged) - 8} more layers like these")
    if check.growth_at is not None:
        evidence.append(
            f"activation RMS at the first forward reaches x{check.growth:.3g} the input's "
            f"(input RMS {check.reference:.3g}, floored at 1) at {check.growth_at}"
        )
    if check.chain_names:
        evidence.append(
            f"from {check.chain_names[0]} to {check.chain_names[-1]} the scale grows "
            f"x{check.chain:.3g} per weight layer on average"
        )
    if (a := check.nonfinite) is not None:
        evidence.append(
            f"first non-finite output at the first forward: {a['name']} ({a['type']}, "
            f"{a['output']['nonfinite']}) while its input was finite"
        )
    if check.loss:
        evidence.append(describe_loss(check.loss))
    if location is not None:
        evidence.append(f"these weights were last set at {location.short()}: {location.code}")
    return evidence


def _scale_fix(check: ModelCheck, names: list[str], ratios: list[float], location) -> str:
    types = {leaf["type"] for leaf in check.leaves}
    if "Tanh" in types and not types & _RELU_LIKE:
        init = "`nn.init.xavier_normal_(w, gain=nn.init.calculate_gain('tanh'))`"
    else:
        init = "`nn.init.kaiming_normal_(w, nonlinearity='relu')`"
    text = f"use the default init or {init} for {names_of(names)}"
    if ratios:
        text += f": weights are {statistics.median(ratios):.0f}x the default scale"
    if location is not None:
        text += f" (they are set at {location.short()})"
    return text + "; in deep stacks, add normalization layers or scale residual branches down"


# ---- single-layer checks ----------------------------------------------------------------------
def _finding(code, title, evidence, fix, severity, weights=()) -> Finding:
    return Finding(
        stage=NAME,
        category="initialization",
        title=title,
        confidence=_CONFIDENCE[severity] - 0.1,
        evidence=tuple(evidence),
        fix=fix,
        location=most_common_write(list(weights)),
        severity=severity,
        code=code,
    )


def _nonfinite_weights(check: ModelCheck) -> Finding | None:
    bad = check.nonfinite_params or [w for _, w in check.weights() if not w.get("finite", True)]
    if not bad:
        return None
    return _at_the_values_origin(
        _finding(
            "IN302",
            f"non-finite weights before training: {names_of([w['param'] for w in bad])}",
            [_describe_nonfinite(w) for w in bad[:8]],
            "initialize these weights (an `nn.init` call, or create them with values: "
            "`torch.empty` and `torch.Tensor(n)` leave memory as it was); check the checkpoint "
            "or init code that set them",
            "error",
            bad,
        )
    )


def _at_the_values_origin(finding: Finding) -> Finding:
    """Weights set from values computed elsewhere (`layer.bias = nn.Parameter(bias)`) lead with
    the line that computed them, where the NaN/Inf was made (`bias = torch.log(pos / neg)`):
    the write stays as evidence."""
    written = finding.location
    made = written and written.file and written_value_origin(written.file, written.line)
    if not made:
        return finding
    note = (
        f"the values were computed at line {made.line} (`{made.code}`) and set at {written.short()}"
    )
    moved = Location(written.file, made.line, None, made.code)
    fix = (
        f"the values set into these weights are computed non-finite at line {made.line}: keep "
        "that computation finite (a log or a division of a count that can be 0 needs a floor: "
        "`torch.log(x.clamp_min(1e-12))`), or initialize these weights with an `nn.init` call"
    )
    return replace(finding, location=moved, fix=fix, evidence=(*finding.evidence, note))


def _describe_nonfinite(weight: dict) -> str:
    text = f"{weight['param']} {tuple(weight['shape'])} holds NaN/Inf at the first forward"
    if weight.get("nonfinite"):
        text += f" ({weight['nonfinite']})"
    written = Location.from_dict(weight.get("written"))
    if written and weight.get("uninitialized"):
        text += (
            f": allocated uninitialized at {written.short()} ({(written.code or '').strip()}), "
            "and nothing wrote those values before it. nandoctor reads such memory as NaN, as "
            "torch's deterministic mode does (`fill_uninitialized_memory`); a plain run reads "
            "whatever the allocator left there: zeros (0/0 in a normalization), stale finite "
            "values, NaN"
        )
    elif written:
        text += f", last set at {written.short()}: {(written.code or '').strip()}"
    return text


def _bias_finding(check: ModelCheck) -> Finding | None:
    big = []
    for layer in check.layers:
        kappa = max([w.get("kappa", 0.0) for w in layer.get("weights", [])], default=0.0)
        bias = layer.get("bias_rms")
        if layer["kind"] == "norm" or bias is None:
            continue
        if bias > check.settings.bias_ratio * max(kappa, 1.0):
            big.append((layer, bias, kappa))
    if not big:
        return None
    return _finding(
        "IN303",
        f"biases of {names_of([layer['name'] for layer, _, _ in big])} dwarf their weights' output",
        [
            f"{layer['name']}: bias RMS {bias:.3g} against the weights' output scale "
            f"kappa = {kappa:.3g}"
            for layer, bias, kappa in big[:8]
        ],
        "initialize biases to zero (`nn.init.zeros_(layer.bias)`) or keep the default",
        "warning",
    )


def _embedding_finding(check: ModelCheck) -> Finding | None:
    big = [
        w
        for layer, w in check.weights()
        if layer["kind"] == "embedding" and w.get("rms", 0.0) > check.settings.embedding_rms_warn
    ]
    if not big:
        return None
    return _finding(
        "IN304",
        f"embeddings {names_of([w['param'] for w in big])} are large",
        [f"{w['param']}: RMS {w['rms']:.3g} (the default N(0, 1) gives 1)" for w in big],
        "initialize embeddings with `nn.init.normal_(w, std=0.02)` or keep the default N(0, 1)",
        "warning",
        big,
    )


def _recurrent_finding(check: ModelCheck) -> Finding | None:
    s, hits, severity = check.settings, [], "warning"
    for layer in check.layers:
        gated = layer.get("mode") in ("LSTM", "GRU")
        for record in layer.get("recurrent", []):
            sigma = record["sigma_max"]
            if sigma > (s.gated_rnn_sigma_warn if gated else s.rnn_sigma_warn):
                hits.append((layer, record))
                if not gated and sigma > s.rnn_sigma_error:
                    severity = "error"
    if not hits:
        return None
    return _finding(
        "IN305",
        f"recurrent weights of {names_of([layer['name'] for layer, _ in hits])} amplify the state",
        [
            f"{record['param']} ({layer['mode']}): largest singular value "
            f"{record['sigma_max']:.3g} (PyTorch's default gives about 1.15)"
            for layer, record in hits[:8]
        ],
        "keep the default init or use `nn.init.orthogonal_` for the recurrent weights (weight_hh)",
        severity,
    )


def _norm_finding(check: ModelCheck) -> Finding | None:
    bad_var = [
        layer
        for layer in check.layers
        if layer.get("running_var_finite") is False or layer.get("running_var_min", 1.0) <= 0
    ]
    if bad_var:
        return _finding(
            "IN306",
            f"running variance of {names_of([layer['name'] for layer in bad_var])} is not positive",
            [
                f"{layer['name']}: smallest running_var {layer['running_var_min']}"
                for layer in bad_var
            ],
            "reset the running statistics (`module.reset_running_stats()`)",
            "error",
        )
    big = [
        layer
        for layer in check.layers
        if layer.get("gamma_rms", 0.0) > check.settings.norm_gamma_warn
    ]
    if not big:
        return None
    return _finding(
        "IN306",
        f"norm scales of {names_of([layer['name'] for layer in big])} are large",
        [
            f"{layer['name']}: RMS of the scale {layer['gamma_rms']:.3g} (default 1)"
            for layer in big
        ],
        "initialize norm scales to 1 (`nn.init.ones_(norm.weight)`)",
        "warning",
    )


def _loss_finding(check: ModelCheck, level: str) -> Finding:
    loss = check.loss
    evidence = [describe_loss(loss)]
    if (logits := loss.get("input")) and logits.get("finite"):
        evidence.append(
            f"its input (the logits) has RMS {logits['rms']:.3g}, largest {logits['absmax']:.3g}"
        )
    return _finding(
        "IN307",
        f"the starting loss {loss['value']:.4g} is far above ln C = {loss['expected']:.3g}",
        evidence,
        "start from small logits: keep the default init of the last layer, or scale it down "
        "(zero-initializing the classifier, `nn.init.zeros_(head.weight)`, is common)",
        level,
    )


# ---- wording ----------------------------------------------------------------------------------
def describe_weight(layer: dict, w: dict) -> str:
    shape = w["shape"]
    size = f"{w['fan_in']}->{shape[0]}" if len(shape) >= 2 else tuple(shape)
    return (
        f"{layer['name']} ({layer['type']} {size}): rms(W) {w['rms']:.3g}, "
        f"kappa = rms*sqrt(fan_in) = {w['kappa']:.3g}, {w['kappa'] / w['default_kappa']:.0f}x "
        f"the PyTorch default {w['default_kappa']:.2f} (Kaiming for ReLU gives 1.41)"
    )


def describe_loss(loss: dict) -> str:
    return (
        f"starting loss {loss['value']:.4g}, expected about ln {loss['classes']} = "
        f"{loss['expected']:.3g} for a fresh {loss['loss']} classifier"
    )


def most_common_write(weights: list[dict]) -> Location | None:
    """The line that set most of these weights (ties: the first layer's)."""
    written = [w["written"] for w in weights if w.get("written")]
    if not written:
        return None
    (file, line), _ = Counter((w["file"], w["line"]) for w in written).most_common(1)[0]
    return Location.from_dict(next(w for w in written if (w["file"], w["line"]) == (file, line)))


def names_of(names: list[str]) -> str:
    """`a, b, c` for a few names, `first..last (n layers)` for many."""
    names = list(dict.fromkeys(n for n in names if n))
    if len(names) <= 4:
        return ", ".join(names)
    return f"{names[0]}..{names[-1]} ({len(names)} layers)"
