"""The findings nandoctor can make, one stable code each (as pylint's and ruff's message ids).

A code names one claim and the positive evidence it stands on; it never changes meaning. The
report carries it with every finding and cause, `nandoctor explain CODE` prints its entry, and
`benchmarks/confidence_table.py` measures how often each was right on the labelled corpus's dev
split (`confidence.json`, read by `measured_confidence`). The first two letters name the
category, the first digit the stage that makes it: 1 the watched run's first NaN/Inf
(anomaly), 2 the data scan, 3 the init check, 4 the device/precision comparison, 5 the
learning-rate sweep, 6 the diagnosis's own reasoning across stages.

Each code lists fixture scripts (under tests/scripts) whose report must contain it:
tests/test_codes.py runs them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

PREFIXES = {
    "DA": "data",
    "LR": "learning_rate",
    "IN": "initialization",
    "IO": "invalid_operation",
    "EG": "exploding_gradients",
    "PR": "precision",
    "DV": "device",
    "OC": "optimizer_config",
}
# How many dev-split observations the prior (the hand-set confidence of the finding) is worth:
# a code seen twice moves a little towards its record, a code seen twenty times mostly is it.
PRIOR_WEIGHT = 4.0


@dataclass(frozen=True)
class Code:
    code: str
    stage: str
    claim: str  # one line: what the finding says about the run
    evidence: str  # the positive evidence it needs before it is made
    fixtures: tuple[str, ...] = ()  # tests/scripts whose report must contain this code
    profile: str = "quick"  # the cheapest profile whose stages make it

    @property
    def category(self) -> str:
        return PREFIXES[self.code[:2]]


_CODES = (
    # ---- the watched run's first NaN/Inf (stages/anomaly.py) -----------------------------------
    Code(
        "DA101",
        "anomaly",
        "non-finite values entered torch from outside its ops (data, numpy, a file)",
        "the op that first held NaN/Inf received it in its inputs (or made a tensor from a Python or "
        "numpy value) before any parameter was involved, or read it from a frozen lookup table "
        "(an embedding given the data's values with `from_pretrained`, never trained)",
        ("data_nan_rows_loader.py", "frozen_item_features_nan.py"),
    ),
    Code(
        "DA102",
        "anomaly",
        "samples whose CTC target is longer than their input can align",
        "the first Inf is born in ctc_loss, and some samples of the batch have fewer input "
        "frames than their target needs (one per label, plus a blank between repeated labels)",
        ("data_ctc_short_inputs.py",),
    ),
    Code(
        "OC101",
        "anomaly",
        "the optimizer's update divides by zero",
        "the first NaN/Inf is born inside optimizer.step() in a division whose denominator holds "
        "exact zeros (Adam's sqrt(v) + eps with eps = 0)",
        ("adam_eps_zero.py",),
    ),
    Code(
        "OC102",
        "anomaly",
        "the script's own optimizer update takes an op outside its domain",
        "the first NaN/Inf is born inside an optimizer.step() whose code is the script's (an "
        "optimizer class pasted into the project), from finite gradients and state, in an op "
        "whose input left its domain (sqrt of a variance estimate n - g*g rounded below 0)",
        ("optimizer_own_centred_sqrt.py",),
    ),
    Code(
        "OC103",
        "anomaly",
        "the optimizer's update overflows, and not because of the learning rate",
        "the first Inf is born inside optimizer.step() by overflow from finite inputs, in float32, "
        "and either the learning-rate sweep showed a much smaller rate failing at the same step, "
        "or the optimizer has no learning rate at all (an AdaDelta ported without one), or it is "
        "a quotient of an update the script wrote itself (a denominator decaying towards 0, "
        "such as a bias correction written beta**t for 1 - beta**t)",
        ("optimizer_own_debias_overflow.py",),
    ),
    Code(
        "LR101",
        "anomaly",
        "the optimizer's update overflowed",
        "the first non-finite value is born inside optimizer.step() from finite inputs, by "
        "overflow rather than a division by zero",
    ),
    Code(
        "PR101",
        "anomaly",
        "an op overflowed the reduced-precision dtype it computed in",
        "the op that made the first Inf computed in float16 or bfloat16 and its result exceeded "
        "that dtype's largest value",
        ("autocast_fp16_overflow.py",),
    ),
    Code(
        "PR102",
        "anomaly",
        "the optimizer's eps rounds to zero in the parameters' reduced precision",
        "the optimizer's update divides by zero in float16/bfloat16 although its configured eps "
        "is positive (1e-8 is 0 in float16)",
        ("precision_adam_eps_fp16.py",),
    ),
    Code(
        "EG101",
        "anomaly",
        "gradients overflow in backward although the forward pass was finite",
        "the first Inf is born in a backward op from finite inputs, by overflow",
    ),
    Code(
        "IO101",
        "anomaly",
        "an op overflows in a branch the forward discards, but its gradient does not",
        "a forward op overflowed, the loss stayed finite (torch.where / masked_fill dropped it), "
        "and the NaN reached a gradient",
    ),
    Code(
        "IO102",
        "anomaly",
        "an op overflows float32 before any update",
        "float32 (not a reduced precision) overflowed at step 0, before the learning rate acted",
        ("exp_overflow.py",),
    ),
    Code(
        "IO103",
        "anomaly",
        "an op overflows float32 at a step that does not depend on the learning rate",
        "the learning-rate sweep showed a much smaller rate failing at about the same step",
        ("contrastive_temperature_annealed.py",),
        "standard",
    ),
    Code(
        "LR102",
        "anomaly",
        "values grew over the steps until an op overflowed",
        "a float32 op overflowed after some updates; the rate has not been ruled out",
        ("hand_sgd_diverges.py",),
    ),
    Code(
        "IO104",
        "anomaly",
        "the gradient of an op is not finite at its input",
        "the first NaN/Inf is born in the backward of a forward op whose derivative is infinite "
        "or undefined at its input (sqrt(0), a norm of a zero vector, acos(1)), or overflows "
        "there because the op's denominator collapsed towards 0 (a learned variance of 1e-41); "
        "located at a clamp when the op's input came from one whose bound is that very point "
        "and values sat on it (`sqrt(d.clamp(min=0))`, `acos(c.clamp(-1, 1))`)",
        (
            "sqrt_backward.py",
            "gaussian_nll_variance_collapse.py",
            "pairwise_distance_clamp_zero.py",
        ),  # fmt: skip
    ),
    Code(
        "IO105",
        "anomaly",
        "an op received inputs outside its domain",
        "the op that made the first NaN/Inf in the forward pass received inputs outside its "
        "domain (log of 0, 0/0, a fractional power of a negative base, the sample std of a "
        "single value); located at a clamp "
        "whose bound put the values there (`log(p.clamp(min=0))`), as IO104",
        ("bare_tensor_log_zero.py", "div_zero_norm_module.py"),
    ),
    Code(
        "DV102",
        "anomaly",
        "the NaN/Inf appears only in the torch.compile'd run",
        "the same script run eagerly (torch.compile disabled, same seed) stays finite through "
        "the failing step",
        ("compiled_only_softmax.py",),
        "standard",
    ),
    Code(
        "IN101",
        "anomaly",
        "parameters hold NaN/Inf that no op of the run made",
        "the first NaN/Inf reached an op through a parameter (an nn.Parameter) that was already "
        "non-finite: loaded from a checkpoint, `torch.empty` never filled, written under no_grad",
        ("init_nonfinite_weight.py",),
    ),
    Code(
        "IN102",
        "anomaly",
        "weights as initialized are outside the domain of the op that reads them",
        "before any update, a forward op whose every input is a parameter made NaN/Inf from "
        "finite values: weight_norm of a zero-initialised direction (0/0), log of a learnable "
        "scale initialised to 0",
        ("init_weight_norm_zero.py",),
    ),
    # ---- the data scan (stages/data_scan) ------------------------------------------------------
    Code(
        "DA201",
        "data_scan",
        "batches the model consumed hold NaN/Inf",
        "NaN/Inf counted in the batch tensors the script fed to the model, traced back to the "
        "samples (and the line) that made them",
        ("data_nan_rows_loader.py",),
    ),
    Code(
        "DA202",
        "data_scan",
        "every target of a batch equals ignore_index: a mean over no targets",
        "a loss called with reduction='mean' whose targets all equal its ignore_index",
        ("data_all_ignored_batch.py",),
    ),
    Code(
        "DA203",
        "data_scan",
        "class targets outside [0, C)",
        "targets of a classification loss outside the number of classes of its input",
        ("data_label_out_of_range.py",),
    ),
    Code(
        "DA204",
        "data_scan",
        "inputs far from unit scale",
        "batch values whose magnitude exceeds the data scan's threshold; in a run that failed, "
        "floating batch tensors whose RMS exceeds the scale threshold, with a re-run that "
        "standardizes them: a cause when that re-run trains",
        ("precision_half_overflow.py", "data_raw_counts_vae.py"),
    ),
    Code(
        "DA205",
        "data_scan",
        "some samples are constant (blank images, empty masks)",
        "samples of a floating batch tensor with a single value throughout",
    ),
    # ---- the init check (stages/init_check) ----------------------------------------------------
    Code(
        "IN301",
        "init_check",
        "weights far outside the scale their layer needs",
        "weights whose gain (output RMS over input RMS) or spread is orders of magnitude off "
        "the layer's default initialisation, measured at the first forward pass",
        ("init_uniform_deep_mlp.py",),
    ),
    Code(
        "IN302",
        "init_check",
        "non-finite weights before training",
        "parameters that hold NaN/Inf at the first forward pass, bare `nn.Parameter`s of "
        "the user's own modules included, located at the line that last set them, or at the "
        "line that computed the values that line sets; memory the script allocated with "
        "`torch.empty` (`empty_like`, `new_empty`) and never wrote reads as NaN "
        "(instrument/uninitialized.py) and is located at the allocation",
        (
            "init_nonfinite_weight.py",
            "init_uninitialized_crf.py",
            "init_empty_prototypes.py",
            "init_log_prior_bias_empty_class.py",
        ),
    ),
    Code(
        "IN303",
        "init_check",
        "biases far larger than their layer's weights",
        "bias RMS above the configured ratio to the weights' scale",
        ("init_scaled_parts.py",),
    ),
    Code(
        "IN304",
        "init_check",
        "embedding rows far from unit scale",
        "embedding weights whose RMS is far above the default N(0, 1)",
        ("init_scaled_parts.py",),
    ),
    Code(
        "IN305",
        "init_check",
        "a recurrent weight whose spectral radius makes the recurrence explode",
        "the recurrent weight's largest singular value, measured at the first forward pass",
        ("init_scaled_parts.py",),
    ),
    Code(
        "IN306",
        "init_check",
        "normalisation statistics or scales out of range",
        "a running variance that is not positive, or norm scales far above 1",
    ),
    Code(
        "IN307",
        "init_check",
        "the starting loss is far above what an untrained model gives",
        "the first cross-entropy far above ln C, with the logits' scale as evidence",
    ),
    # ---- the device / precision comparison (stages/device_compare) -----------------------------
    Code(
        "PR401",
        "device_compare",
        "reduced precision: the float64 reference stays finite where the run does not",
        "float16/bfloat16/TF32 in use on the failing chain, and the same op computed in float64 "
        "on the same inputs, or on float64 values followed from the step's start, stays finite "
        "or within tolerance; its fix is verified with the op's line in float32, or else with "
        "the model kept in float32, and a run in float32 that trains at the original learning "
        "rate leads a smaller rate",
        (
            "precision_eps_rounds_to_zero.py",
            "autocast_eps_at_the_op.py",
            "autocast_fp16_mask_constant.py",
        ),
        "standard",
    ),
    Code(
        "DV401",
        "device_compare",
        "two backends disagree on the same op at the same precision",
        "the accelerator's result of an op differs from the CPU's beyond tolerance, or is "
        "non-finite where the CPU's is not",
    ),
    Code(
        "DV402",
        "device_compare",
        "the run goes non-finite on the accelerator but not on the CPU",
        "the whole run compared: the accelerator run fails, the CPU run does not, and no single "
        "op was isolated",
    ),
    # ---- the learning-rate sweep (stages/lr_sweep) ---------------------------------------------
    Code(
        "LR501",
        "lr_sweep",
        "the learning rate is too high",
        "the run fails at x1 and trains (loss still falling) over at least the same horizon at "
        "a smaller multiplier",
        ("lr_diverging_sgd.py",),
        "standard",
    ),
    Code(
        "EG501",
        "lr_sweep",
        "gradient spikes: the run trains once gradients are clipped",
        "the run at the original (or the stable) learning rate with gradients clipped at a "
        "value taken from the run's healthy gradient norms, or 10x or 100x tighter, trains over "
        "the whole horizon, and changed at least one step; it leads the learning rate only "
        "when no smaller rate trained (stable with its loss still falling: a smaller rate that "
        "is stable only because the loss barely moved does not count), when it changed few "
        "steps after a jump (not a growth) of the gradient norm, or when it trains at the "
        "original rate and the script's own clipping is switched off (`grad_clip=None`, a "
        "`--clip` defaulting to 0, its clipping call commented out or under an `if` on an "
        "option that is false in this run)",
    ),
    Code(
        "EG502",
        "lr_sweep",
        "gradients explode through a recurrence: the run trains once they are clipped",
        "as EG501, in a model whose weights are applied 8 or more times in a row to their own "
        "output (torch's RNN/LSTM/GRU over a sequence, or a cell called step after step on "
        "its hidden state): gradients through the chain are products of one Jacobian per "
        "step, and clipping is the remedy even where a smaller rate also trains",
    ),
    Code(
        "EG503",
        "lr_sweep",
        "gradient spikes at the same batches at every learning rate: clipping keeps the rate",
        "a step's gradient norm jumps 5x above the steps before it at x1 and, at the same step "
        "(the candidates see the same batches), at two smaller rates, one of them at most x1/4; "
        "and x1 with gradients clipped runs past x1's failure without diverging, its late loss "
        "at most 1.2x the best of the smaller rates (stages/lr_sweep/batch_spikes.py)",
        ("cross_network_batch_cliffs.py",),
        "standard",
    ),
    # ---- the diagnosis across stages (ranking.py, optimizer_settings.py) -----------------------
    Code(
        "EG601",
        "diagnosis",
        "the loss is multiplied by a large constant before backward()",
        "backward() called on the loss times a constant >= 1e3 with no GradScaler",
        ("scaled_loss_no_scaler.py",),
    ),
    Code(
        "EG602",
        "diagnosis",
        "one step's gradient norm jumped by orders of magnitude after steady steps",
        "before the failure, a step's gradient norm was >= 100x the median of the steps before "
        "it, all of which were within 10x of that median, and >= 10x more than that step's loss "
        "rose above theirs",
        ("gradient_cliff_rnn.py",),
    ),
    Code(
        "EG603",
        "diagnosis",
        "the script's own gradient clipping never acted",
        "in a run that failed, a clip_grad_norm_/clip_grad_value_ call before the failure was "
        "given no tensors (a consumed `model.parameters()` generator), none with a gradient, or "
        "ran after optimizer.step(); a cause when its re-run, clipping at the script's max_norm "
        "before each step, trains",
        ("clip_consumed_generator.py", "clip_before_backward_closure.py"),
    ),
    Code(
        "EG604",
        "diagnosis",
        "gradients explode through a recurrence in a script that updates by hand",
        "a model applies the same weights 8 or more times in a row to their own output, its "
        "gradient norm rose 100x above its level of the first third of the run before the "
        "failure, and the script updates its parameters itself (no optimizer for a sweep to "
        "scale) and clips nothing; a cause when its re-run, clipping after each backward "
        "pass, trains (recurrence.py)",
        ("hand_updated_char_rnn.py",),
    ),
    Code(
        "LR601",
        "diagnosis",
        "the run diverged before it produced NaN/Inf",
        "the loss grew by an order of magnitude (or the gradient norm by 100x) before the "
        "failure, and the learning rate was not ruled out",
    ),
    Code(
        "LR602",
        "diagnosis",
        "the learning rate is far outside any sensible range",
        "an optimizer built with a learning rate no training uses (lr >= 10 for Adam-family "
        "optimizers, say): a typo in an exponent",
        ("lr_typo_adam.py",),
    ),
    Code(
        "OC602",
        "diagnosis",
        "optimizer settings far outside any sensible range",
        "an optimizer built with weight decay, momentum, betas or eps outside their ranges",
        ("adamw_decay_typo.py",),
    ),
    Code(
        "OC603",
        "diagnosis",
        "L-BFGS takes full quasi-Newton steps without a line search",
        "a run that failed with an LBFGS built with line_search_fn=None; a cause when its "
        're-run with line_search_fn="strong_wolfe" trains',
        ("optimizer_lbfgs_no_line_search.py",),
    ),
)
CODES: dict[str, Code] = {entry.code: entry for entry in _CODES}


@cache
def _table() -> dict:
    text = resources.files("nandoctor").joinpath("confidence.json").read_text(encoding="utf-8")
    return json.loads(text)["codes"]


def record(code: str) -> dict | None:
    """The dev split's record of `code`: {"right": r, "seen": n}, or None when never seen."""
    return _table().get(code)


def measured_confidence(code: str, prior: float) -> float:
    """`prior` (the finding's own, hand-set strength) moved towards how often the code was
    right on the dev split: (right + w * prior) / (seen + w), w = PRIOR_WEIGHT."""
    seen = record(code)
    if not seen or not seen["seen"]:
        return prior
    return (seen["right"] + PRIOR_WEIGHT * prior) / (seen["seen"] + PRIOR_WEIGHT)
