"""The run spine end to end: planted bugs are localized to their birth; healthy scripts stay quiet."""

import pytest

from conftest import SCRIPTS, line_of

ANOMALY = ("--stages", "anomaly")


@pytest.mark.parametrize(
    ("script", "phase", "op", "module", "marker", "why"),
    [
        ("log_zero_loss.py", "forward", "aten.log.default", None,
         "torch.log(probs", "log of 22 zero inputs"),
        ("div_zero_norm_module.py", "forward", "aten.div.Tensor", "encoder.layers.1",
         "return h / h.sum", "division by zero"),
        ("sqrt_backward.py", "backward", "aten.div.Tensor", None,
         "torch.sqrt((diff", "derivative of sqrt(x) is infinite at x = 0"),
        ("where_log_grad.py", "backward", "aten.div.Tensor", None,
         "torch.where(x > 0, torch.log(x)", "derivative of log(x) is infinite"),
        ("exp_overflow.py", "forward", "aten.exp.default", None,
         "e = torch.exp(logits)", "overflows float32"),
    ],
)  # fmt: skip
def test_birth_is_located(nandoctor, script, phase, op, module, marker, why):
    result = nandoctor("run", script, *ANOMALY)
    assert result.exit_code == 1, result.stderr
    report = result.report
    assert report["status"] == "nonfinite"
    first = report["first_nonfinite"]
    assert (first["phase"], first["op"], first["module"]) == (phase, op, module)
    assert first["location"]["file"].endswith(script)
    assert first["location"]["line"] == line_of(script, marker)
    assert marker in first["location"]["code"]
    assert why in first["explanation"]
    assert first["step"] == 0
    assert report["causes"], "a non-finite run must name a cause"
    cause = report["causes"][0]
    assert cause["location"]["line"] == first["location"]["line"]
    # the proposed fix was applied to a re-run of the script, which then stayed finite
    assert cause["verified_fix"] is True, cause["evidence"]


@pytest.mark.parametrize(
    ("script", "op", "marker", "why"),
    [
        ("numpy_nan_input.py", "torch.from_numpy", "features = torch.from_numpy(table)",
         "already holds nan=1"),
        ("overflow_conversion.py", "aten._to_copy.default", "x = raw.float()",
         "conversion float64 -> float32 overflows (|x| up to 1e+39"),
    ],
)  # fmt: skip
def test_values_entering_non_finite_are_born_where_the_tensor_was_made(
    nandoctor, script, op, marker, why
):
    result = nandoctor("run", script, *ANOMALY)
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["op"]) == ("data", op)
    assert first["location"]["line"] == line_of(script, marker)
    assert why in first["explanation"]
    assert result.report["causes"][0]["category"] == "data"


def test_a_model_of_bare_tensors_fails_in_its_forward_not_in_the_data(nandoctor):
    # No nn.Module is ever called: the op that made the NaN still computes from the weights.
    script = "bare_tensor_log_zero.py"
    result = nandoctor("run", script, *ANOMALY)
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["op"]) == ("forward", "aten.log.default")
    assert first["location"]["line"] == line_of(script, "torch.log(pred)")
    assert result.report["causes"][0]["category"] == "invalid_operation"


def test_a_running_variance_that_overflows_is_born_in_batch_norm():
    """Batch norm writes its running statistics though its schema does not say so: an
    overflow there is born in that op, not 'already non-finite' when the next step reads it."""
    from types import SimpleNamespace

    import torch

    from nandoctor.instrument.detector import NonfiniteDetector

    context = SimpleNamespace(paused=False, stopping=False, phase="forward", module="bn", step=3)
    norm = torch.nn.BatchNorm1d(4)
    x = torch.full((8, 4), 3e19)
    x[::2] *= -1  # a batch variance of 9e38: float32 holds its output, not its running variance
    detector = NonfiniteDetector(context)
    detector.activate()
    try:
        assert torch.isfinite(norm(x)).all()
    finally:
        detector.deactivate()
    (birth,) = detector.births.values()
    assert birth.op == "aten.native_batch_norm.default" and birth.phase == "forward"
    assert not birth.inputs_nonfinite and not torch.isfinite(norm.running_var).any()


def test_a_quotient_overflows_by_its_denominator_or_by_its_numerator():
    """A float32 quotient that overflows because its denominator collapsed towards 0 (4e3 over
    1e-38) is the formula's singularity, as an exact 0 is; one whose numerator grew is an
    overflow; in float16 a small denominator is a question of range."""
    import torch

    from nandoctor.instrument.explain import explain_birth
    from nandoctor.instrument.kinds import CONSTANT_OVERFLOW, DIVISION_BY_ZERO, OVERFLOW

    def kind(a, b, dtype=torch.float32):
        a, b = torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)
        return explain_birth("div", (a, b), {}, a / b).kind

    assert kind([4403.0, 1.0], [1e-38, 1.0]) == DIVISION_BY_ZERO
    assert kind([1e38, 1.0], [0.1, 1.0]) == OVERFLOW
    assert kind([3.0, 1.0], [1e-5, 1.0], torch.float16) == OVERFLOW
    x = torch.ones(3, dtype=torch.float16)
    assert explain_birth("mul", (x, -1e9), {}, x * -1e9).kind == CONSTANT_OVERFLOW
    assert explain_birth("mul", (x, -1e4), {}, x * 1e5).kind != CONSTANT_OVERFLOW


def test_a_variance_collapsed_towards_zero_is_the_formulas_singularity(nandoctor):
    # The gradient of (a - mean)**2 / (2 * var) overflows in backward as var approaches 0: the
    # forward was finite and no gradient grew upstream. Guarding the denominator trains at the
    # original rate; clipping or a smaller rate only hides or postpones it.
    script = "gaussian_nll_variance_collapse.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["kind"]) == ("backward", "division_by_zero")
    assert first["facts"]["near_zero"] > 0
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("invalid_operation", "IO104")
    assert cause["location"]["line"] == line_of(script, "/ (2 * var)")
    assert cause["verified_fix"] is True
    assert "clamp_min" in cause["fix"]


def test_a_softmax_over_a_fully_masked_row_is_fixed_at_the_mask(nandoctor):
    # An empty bag's scores are all -inf: the softmax is right to give 0/0, and the line to edit
    # is the mask's constant, rewritten and re-run as `torch.finfo(dtype).min`.
    script = "attention_pool_empty_bag_mask.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["kind"]) == ("forward", "masked_softmax")
    assert first["location"]["line"] == line_of(script, "F.softmax(scores")
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("invalid_operation", "IO105")
    assert cause["location"]["line"] == line_of(script, 'masked_fill(~present, float("-inf"))')
    assert cause["verified_fix"] is True
    assert "masked_fill(~present, torch.finfo(scores.dtype).min)" in cause["fix"]


def test_a_clamp_whose_bound_the_next_op_cannot_take_is_fixed_at_the_clamp(nandoctor):
    # sqrt(d2.clamp(min=0)): the script guarded the square root, but a distance of a point to
    # itself sits on the bound, where the derivative of sqrt is infinite. The line to edit is
    # the clamp's, rewritten and re-run with its bound just inside the domain.
    script = "pairwise_distance_clamp_zero.py"
    result = nandoctor("run", script, *ANOMALY)
    assert result.exit_code == 1
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["step"]) == ("backward", 0)
    assert first["location"]["line"] == line_of(script, "return d2.sqrt()")
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("invalid_operation", "IO104")
    assert cause["location"]["line"] == line_of(script, "d2 = d2.clamp(min=0.0)")
    assert cause["fix"].startswith("`d2 = d2.clamp(min=1e-12)`")
    assert any("32 of its 1024 values sat on the bound" in e for e in cause["evidence"])
    assert cause["verified_fix"] is True
    assert any("re-ran with line 19 as `d2 = d2.clamp(min=1e-12)`" in e
               for e in cause["evidence"])  # fmt: skip


def test_a_std_of_a_single_value_is_fixed_without_the_correction(nandoctor):
    # The last minibatch holds one transition: its sample std divides by n - 1 = 0. The
    # formula is the cause whatever the learning rate: the re-run computes the line's std
    # without the correction, as the fix shown does.
    script = "advantage_std_single_sample.py"
    result = nandoctor("run", script, *ANOMALY)
    assert result.exit_code == 1
    first = result.report["first_nonfinite"]
    assert (first["op"], first["kind"]) == ("aten.std.correction", "too_few_elements")
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("invalid_operation", "IO105")
    assert cause["location"]["line"] == line_of(script, "adv = (adv - adv.mean())")
    assert cause["fix"].startswith("`adv = (adv - adv.mean()) / (adv.std(correction=0) + 1e-8)`")
    assert cause["verified_fix"] is True


def test_a_mean_over_an_empty_selection_is_named_as_such(nandoctor):
    # An empty tensor holds no NaN/Inf to count: the op's input is empty, and the fix says so.
    script = "pairwise_ranking_empty_pairs.py"
    result = nandoctor("run", script, *ANOMALY)
    first = result.report["first_nonfinite"]
    assert (first["op"], first["kind"]) == ("aten.mean.default", "empty_reduction")
    assert first["explanation"] == "reduction over an empty tensor"
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("invalid_operation", "IO105")
    assert cause["location"]["line"] == line_of(script, "-F.logsigmoid(better - worse).mean()")
    assert "skip the term when its selection is empty" in cause["fix"]


def test_a_nan_gradient_copied_into_a_slice_keeps_its_birth(nandoctor):
    # The STFT's backward copies the NaN gradient into a slice of zeros and transforms the
    # whole tensor: the birth behind it is the root's backward, not values from outside torch.
    script = "stft_envelope_root_padded.py"
    result = nandoctor("run", script, *ANOMALY)
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["op"]) == ("backward", "aten.pow.Tensor_Scalar")
    assert first["location"]["line"] == line_of(script, "envelope = torch.matmul(")
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("invalid_operation", "IO104")
    assert cause["verified_fix"] is True


def test_a_frozen_lookup_table_of_the_datas_values_is_data(nandoctor):
    # Item features frozen into an embedding are read by index and never trained: the NaN
    # they hold is the data's, not an initialization's.
    script = "frozen_item_features_nan.py"
    result = nandoctor("run", script, *ANOMALY)
    first = result.report["first_nonfinite"]
    assert (first["kind"], first["step"]) == ("nonfinite_parameter", 5)
    assert "frozen lookup table (Embedding, requires_grad=False)" in first["explanation"]
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("data", "DA101")
    assert "before `Embedding.from_pretrained`" in cause["fix"]


def test_a_clip_for_a_script_without_clipping_goes_after_its_backward_call(nandoctor):
    # One rare long sequence's gradient jumps (EG602): the script sets no clipping anywhere, so
    # the line to edit is its `loss.backward()`, after which `clip_grad_norm_` goes.
    script = "gradient_cliff_rnn.py"
    result = nandoctor("run", script)
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("exploding_gradients", "EG602")
    assert cause["location"]["line"] == line_of(script, "loss.backward()")
    optimizer_line = line_of(script, "optimizer = torch.optim.SGD")
    assert any("the clip goes right after the backward()" in e and f":{optimizer_line}" in e
               for e in cause["evidence"])  # fmt: skip


def _own_update_cause(nandoctor, script: str, op: str, kind: str, code: str, *stages) -> dict:
    """The top cause of a run whose NaN/Inf is born in the script's own optimizer.step(): it
    is the update's, at the step's line marked "the line to fix"."""
    result = nandoctor("run", script, "--stages", ",".join(("anomaly", *stages)))
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["op"], first["kind"]) == ("optimizer", op, kind)
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("optimizer_config", code)
    assert cause["location"]["line"] == line_of(script, "the line to fix")
    assert all(c["category"] != "learning_rate" for c in result.report["causes"])
    return result.report


def test_an_optimizer_of_the_scripts_own_is_fixed_at_its_failing_line(nandoctor):
    # `v.rsqrt().add_(eps)` inside a pasted optimizer: the inf is born in rsqrt, followed
    # through the in-place ops on that temporary, and the line to fix is the optimizer's own,
    # verified by a re-run that guards it as an op of the script's would be.
    report = _own_update_cause(nandoctor, "optimizer_own_rsqrt_eps.py", "aten.rsqrt.default",
                               "division_by_zero", "OC101")  # fmt: skip
    cause = report["causes"][0]
    # the guard of that line is the fix a re-run verifies; the eps advice comes with it
    assert cause["fix"].startswith("`inverse = v.clamp_min(")
    assert "add eps before dividing" in cause["fix"]
    assert cause["verified_fix"] is True


def test_a_domain_error_in_the_scripts_own_update_is_its_formula(nandoctor):
    # A centred RMSProp's `(n - g * g).sqrt()`: n - g*g of a constant gradient rounds below 0.
    # Born in the update from finite gradients: the optimizer's formula, at its own line,
    # verified by the guard a user would paste (not a smaller rate, not the weights).
    report = _own_update_cause(nandoctor, "optimizer_own_centred_sqrt.py", "aten.sqrt.default",
                               "domain", "OC102")  # fmt: skip
    cause = report["causes"][0]
    assert cause["fix"].startswith("`denom = ((n - g * g).clamp_min(1e-12)).sqrt()")
    assert cause["verified_fix"] is True


def test_an_overflowing_quotient_of_the_scripts_own_update_is_its_formula(nandoctor):
    # `m.div(beta ** t)`: a bias correction written for `1 - beta ** t`. The quotient outgrows
    # float32 at step ~160 whatever the rate; the fix names the line's formula.
    report = _own_update_cause(nandoctor, "optimizer_own_debias_overflow.py", "aten.div.Tensor",
                               "division_by_zero", "OC103")  # fmt: skip
    assert report["first_nonfinite"]["facts"]["near_zero"] > 0
    assert "1 - beta ** step" in report["causes"][0]["fix"]


def test_an_optimizer_without_a_learning_rate_is_not_swept_and_its_rule_is_the_cause(nandoctor):
    # An AdaDelta (no lr: its step is its own ratio) that sums squared updates: the loss grows
    # for a hundred steps, then the sum overflows. No multiplier can scale it, so the sweep is
    # skipped as evidence against the rate, and the update rule is named at its line.
    report = _own_update_cause(nandoctor, "optimizer_own_without_rate.py", "aten.add_.Tensor",
                               "overflow", "OC103", "lr_sweep")  # fmt: skip
    sweep = report["stages"]["lr_sweep"]
    assert sweep["status"] == "skipped" and sweep["conclusion"] == "no_learning_rate"
    assert "has no learning rate" in sweep["summary"]


def test_a_rate_given_per_parameter_group_is_a_rate(nandoctor, tmp_path):
    # The same optimizer given an lr in its parameter groups (not in its defaults) and using
    # it: a rate the sweep scales, so the sweep runs.
    source = (SCRIPTS / "optimizer_own_without_rate.py").read_text()
    source = source.replace("p.sub_(update)", 'p.sub_(update, alpha=group["lr"])')
    source = source.replace("AdaDelta(model.parameters())",
                            'AdaDelta([{"params": model.parameters(), "lr": 1.0}])')  # fmt: skip
    script = tmp_path / "adadelta_group_lr.py"
    script.write_text(source)
    result = nandoctor("run", script, "--stages", "anomaly,lr_sweep")
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "ran" and sweep["conclusion"] != "no_learning_rate"


def test_late_failure_is_localized_by_a_replay(nandoctor):
    """The watched run only checks loss/grads/params; the failure at step K is replayed with
    per-op checks from step K-1, and the report says the replay reproduced it."""
    result = nandoctor("run", "late_log_zero.py", *ANOMALY)
    report = result.report
    first = report["first_nonfinite"]
    assert first["step"] == 6
    assert first["op"] == "aten.log.default"
    assert first["location"]["line"] == line_of("late_log_zero.py", "torch.log(")
    assert report["run"]["localized"] == "replayed"


def test_optimizer_setting_is_blamed_on_the_constructor_line(nandoctor):
    result = nandoctor("run", "adam_eps_zero.py", *ANOMALY)
    report = result.report
    assert report["first_nonfinite"]["phase"] == "optimizer"
    assert "division by zero" in report["first_nonfinite"]["explanation"]
    cause = report["causes"][0]
    assert cause["category"] == "optimizer_config"
    assert cause["location"]["line"] == line_of("adam_eps_zero.py", "torch.optim.Adam(")
    assert "eps=1e-8" in cause["fix"]
    assert cause["verified_fix"] is True


def test_finite_loss_with_nan_gradient_is_caught(nandoctor):
    result = nandoctor("run", "where_log_grad.py", *ANOMALY)
    first = result.report["first_nonfinite"]
    assert first["reached"] == "the gradient of scale"
    cause = result.report["causes"][0]
    assert cause["category"] == "invalid_operation"
    assert "double-where" in cause["fix"]


def test_fix_rewrites_the_users_line(nandoctor):
    result = nandoctor("run", "log_zero_loss.py", *ANOMALY)
    assert (
        "torch.log(probs[torch.arange(32), y].clamp_min(1e-12))"
        in result.report["causes"][0]["fix"]
    )


def test_an_evaluation_after_the_last_step_that_reads_inf_is_a_failure(nandoctor):
    """Training stays finite; the evaluation after it (the model cast to float16) computes an
    inf the script prints. The run ended with that value: not healthy, and located in the
    evaluation's own formula."""
    script = "eval_half_sum_overflow.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "nonfinite"
    first = report["first_nonfinite"]
    assert first["op"] == "aten.sum.dim_IntList" and first["phase"] == "forward"
    assert first["location"]["line"] == line_of(script, "smooth_loss = -lprobs.sum(")
    printed = line_of(script, "eval loss {eval_loss")
    assert first["reached"] == f"a value the script read at line {printed}"
    top = report["causes"][0]
    assert top["category"] == "precision" and top["code"] == "PR101"
    assert top["location"]["line"] == first["location"]["line"]
    assert top["verified_fix"] is True


@pytest.mark.parametrize(
    "script", ["healthy_mlp.py", "healthy_masked_attention.py", "nonfinite_metric_healthy.py"]
)
def test_healthy_scripts_get_no_cause(nandoctor, script):
    result = nandoctor("run", script, *ANOMALY)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.report["status"] == "healthy"
    assert result.report["causes"] == []
    assert result.report["first_nonfinite"] is None
    assert result.report["run"]["steps_observed"] >= 10


def test_recurrent_modules_are_recorded(nandoctor):
    result = nandoctor("run", "recurrent_healthy.py", *ANOMALY)
    assert result.report["status"] == "healthy", result.stdout
    recurrent = {r["type"]: r["chain"] for r in result.report["run"]["recurrent"]}
    assert recurrent == {"GRU": 12, "ElmanCell": 8}  # said once, when the chain reaches 8


def test_the_optimizer_is_described_with_the_rate_its_failing_step_ran_at():
    from nandoctor.stages.anomaly import describe_optimizer

    built = {"type": "SGD", "settings": {"lr": 0.0, "momentum": 0.9}}
    assert describe_optimizer(built) == "SGD(lr=0.0, momentum=0.9)"
    warmed_up = {**built, "lr_at": (33, [0.01])}  # a warm-up from 0 had reached 0.01
    assert describe_optimizer(warmed_up) == (
        "SGD(lr=0.0, momentum=0.9); at step 33 its rate was 0.01 (a scheduler moved it)"
    )
    assert describe_optimizer({**built, "lr_at": (33, [0.0])}) == "SGD(lr=0.0, momentum=0.9)"
    # param groups built at their own rates (a backbone at a tenth): no scheduler moved them
    groups = {"type": "SGD", "settings": {"lr": 0.02}, "lrs": [0.002, 0.02]}
    assert describe_optimizer({**groups, "lr_at": (10, [0.002, 0.02])}) == "SGD(lr=0.02)"
