"""Init check stage: is the model born broken? Weight scale per layer against PyTorch's default
init, activation scale through the first forward, and the starting loss against ln C; each
flagged weight is traced to the line that last set it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nandoctor.report.model import StageResult
from nandoctor.stages import StageContext, StageOutcome
from nandoctor.stages.init_check.analysis import ModelCheck
from nandoctor.stages.init_check.findings import NAME, model_findings

PROBE = True


@dataclass(frozen=True)
class Settings:
    """Settings of this stage (the `init_check:` section of a profile)."""

    kappa_warn: float = 2.83  # kappa = rms(W)*sqrt(fan_in) above 2x He-for-ReLU is off scale
    kappa_error: float = 5.0  # kappa above this with no norm after the layer (5^8 ~ 4e5)
    bias_ratio: float = 10.0  # bias RMS above this x max(kappa, 1) drowns the weights' output
    embedding_rms_warn: float = 10.0  # embedding RMS (the default N(0, 1) gives 1)
    rnn_sigma_warn: float = 1.5  # largest singular value of a tanh/relu RNN's W_hh (default ~1.15)
    rnn_sigma_error: float = 3.0  # same, error
    gated_rnn_sigma_warn: float = 3.0  # same for an LSTM/GRU gate block of W_hh
    norm_gamma_warn: float = 5.0  # RMS of a norm layer's scale gamma (default 1)
    growth_warn: float = 1.0e2  # activation RMS / input RMS anywhere in the first forward
    growth_error: float = 1.0e4  # same, error
    layer_gain_warn: float = 1.5  # mean growth per weight layer over a run of min_chain layers
    layer_gain_error: float = 2.0  # same, error
    min_chain: int = 4  # consecutive weight layers (no norm between) for the per-layer mean
    loss_margin_warn: float = 1.0  # starting loss above ln C + this
    loss_factor_error: float = 3.0  # starting loss above this x ln C
    max_modules: int = 1000  # module outputs recorded during the first forward
    max_roots: int = 4  # models (root modules with parameters) checked


def probe_settings(config) -> dict:
    return dataclasses.asdict(config.init_check)


def install_probe(session, options) -> None:
    from nandoctor.stages.init_check.probe import InitProbe

    InitProbe(session, Settings(**options.extra.get(NAME, {}))).install()


def run(context: StageContext) -> StageOutcome:
    forwards = context.watch.all("init_forward")
    if not forwards:
        return StageOutcome(StageResult("ran", "no model forward was seen"))
    loss = context.watch.first("init_loss")
    findings, summaries, details = [], [], []
    for event in forwards:
        # The first classification loss belongs to the first model called.
        check = ModelCheck(event, loss if event is forwards[0] else None, context.config.init_check)
        findings += model_findings(check)
        summaries.append(check.summary())
        details.append(check.details())
    result = StageResult("ran", "; ".join(summaries), details={"models": details})
    return StageOutcome(result, findings)
