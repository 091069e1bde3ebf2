"""Init check: broken inits found end to end through the CLI and traced to the line that set the
weights; the scale statistics against naive numpy computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import line_of
from nandoctor.instrument.weights import (
    activation_record,
    describe_layer,
    fan_in,
    rms,
    spectral_norm,
)
from nandoctor.instrument.writes import ParameterWrites
from nandoctor.stages.init_check import Settings
from nandoctor.stages.init_check.analysis import ModelCheck
from nandoctor.stages.init_check.findings import model_findings

STAGES = ("--stages", "data_scan,init_check,anomaly")


# ---- end to end -------------------------------------------------------------------------------
def test_uniform_init_of_a_deep_mlp_is_the_top_cause(nandoctor):
    result = nandoctor("run", "init_uniform_deep_mlp.py", *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    cause = result.report["causes"][0]
    assert (cause["category"], cause["stage"]) == ("initialization", "init_check")
    assert cause["title"].startswith("weights of layers.0..head (17 layers) are ")
    assert "x the PyTorch default scale" in cause["title"]
    assert cause["location"]["line"] == line_of("init_uniform_deep_mlp.py", "nn.init.uniform_(p")
    evidence = "\n".join(cause["evidence"])
    assert "layers.0 (Linear 64->64)" in evidence
    assert "first non-finite output at the first forward: layers." in evidence
    assert "expected about ln 10" in evidence
    assert "kaiming_normal_" in cause["fix"] and "layers.0..head" in cause["fix"]


def test_reset_parameters_override_is_traced_to_its_line(nandoctor):
    result = nandoctor("run", "init_reset_parameters.py", *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    cause = result.report["causes"][0]
    assert (cause["category"], cause["stage"]) == ("initialization", "init_check")
    assert cause["title"].startswith("weights of 0..14 (8 layers) are 28x")
    location = cause["location"]
    assert location["function"] == "reset_parameters"
    assert location["line"] == line_of("init_reset_parameters.py", "self.weight.data.normal_")
    assert "starting loss" in "\n".join(cause["evidence"])


# ---- where weights were written ---------------------------------------------------------------
def test_parameter_writes_are_traced_through_aliases():
    writes = ParameterWrites()
    writes.start()
    try:
        layer = nn.Linear(8, 4)
        created = _previous_line()
        at_creation = writes.line_of(layer.weight)
        nn.init.zeros_(layer.bias)
        zeroed = _previous_line()
        layer.weight.data.normal_(0, 3)
        aliased = _previous_line()
        layer.double()  # moves the values, keeps the line
        after_move = writes.line_of(layer.weight)
        layer.weight.data = torch.ones(4, 8, dtype=torch.float64)
        assigned = _previous_line()
        layer.train()  # not a write
    finally:
        writes.stop()
    assert writes.line_of(layer.bias).line == zeroed
    assert after_move.line == aliased
    assert writes.line_of(layer.weight).line == assigned
    assert at_creation.line == created  # nn.Linear's own reset_parameters, called from here
    from torch.overrides import _get_current_function_mode_stack

    assert writes not in _get_current_function_mode_stack()
    nn.init.zeros_(layer.weight)  # after stop: no longer recorded
    assert writes.line_of(layer.weight).line == assigned


def test_a_parameter_made_on_the_meta_device_keeps_its_line_through_to_empty():
    writes = ParameterWrites()
    writes.start()
    try:
        with torch.device("meta"):
            layer = nn.Linear(8, 4)
            layer.scale = nn.Parameter(torch.ones(1))
            created = _previous_line()
        layer.to_empty(device="cpu")
    finally:
        writes.stop()
    assert writes.line_of(layer.scale).line == created


def _previous_line() -> int:
    """The line above the caller's: the write just before it."""
    import sys

    return sys._getframe(1).f_lineno - 1


# ---- oracles ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module",
    [
        nn.Linear(48, 16),
        nn.Conv2d(6, 4, (3, 5), groups=2),
        nn.Conv1d(3, 8, 7),
        nn.ConvTranspose2d(4, 6, 3),
    ],
)
def test_kappa_against_numpy(module):
    layer = describe_layer(
        "layer", module, "conv" if isinstance(module, nn.modules.conv._ConvNd) else "linear"
    )
    record = layer["weights"][0]
    w = module.weight.detach().double().numpy()
    naive_fan_in = w.shape[1] * int(np.prod(w.shape[2:]))
    naive_rms = math.sqrt(float((w**2).mean()))
    assert record["fan_in"] == naive_fan_in == fan_in(module.weight)
    assert record["rms"] == pytest.approx(naive_rms, rel=1e-6)
    assert record["std"] == pytest.approx(float(w.std()), rel=1e-12)
    assert record["kappa"] == pytest.approx(naive_rms * math.sqrt(naive_fan_in), rel=1e-6)
    # PyTorch's default init, U(+-1/sqrt(fan_in)), gives kappa ~ 1/sqrt(3).
    assert record["kappa"] == pytest.approx(1 / math.sqrt(3), rel=0.35)


def test_rms_does_not_overflow_near_the_float32_limit():
    x = torch.full((1000,), 1.0e30)
    assert rms(x) == pytest.approx(1.0e30, rel=1e-6)
    record = activation_record(torch.tensor([1.0, float("inf"), 3.0]))
    assert record["finite"] is False and record["nonfinite"] == "+inf=1 of 3"
    assert record["rms"] == pytest.approx(math.sqrt(5.0))


@pytest.mark.parametrize("size", [64, 1100])
def test_spectral_norm_against_numpy_svd(size):
    generator = torch.Generator().manual_seed(size)
    m = torch.randn(size, size, generator=generator) / math.sqrt(size)
    m[:, 0] *= 3.0  # a leading direction, as a scaled recurrent matrix has
    exact = float(np.linalg.svd(m.double().numpy(), compute_uv=False)[0])
    assert spectral_norm(m) == pytest.approx(exact, rel=1e-3 if size > 1024 else 1e-9)


def test_lstm_gate_blocks_and_default_sigma():
    torch.manual_seed(0)
    lstm = nn.LSTM(16, 32)
    layer = describe_layer("lstm", lstm, "rnn")
    w = lstm.weight_hh_l0.detach().double().numpy()
    naive = max(np.linalg.svd(w[i * 32 : (i + 1) * 32], compute_uv=False)[0] for i in range(4))
    assert layer["recurrent"][0]["sigma_max"] == pytest.approx(naive, rel=1e-9)
    assert 0.8 < naive < 1.6  # PyTorch's default U(+-1/sqrt(H)) gives about 1.15
    assert {w["param"] for w in layer["weights"]} == {"lstm.weight_ih_l0", "lstm.weight_hh_l0"}


def _activation(name, kind, rms_in, rms_out, leaf=True):
    record = lambda value: {"finite": True, "rms": value, "absmax": value}  # noqa: E731
    return {
        "name": name,
        "type": kind or "ReLU",
        "kind": kind,
        "leaf": leaf,
        "input": record(rms_in),
        "output": record(rms_out),
    }


def test_growth_and_per_layer_chain_against_a_hand_computation():
    # input rms 2; each Linear multiplies by 10, a LayerNorm resets to 1 and ends the first run.
    scales = [2.0 * 10**i for i in range(6)]
    acts = [_activation(f"fc{i}", "linear", scales[i], scales[i + 1]) for i in range(5)]
    acts += [_activation("norm", "norm", scales[5], 1.0), _activation("fc5", "linear", 1.0, 3.0)]
    event = {
        "root": "Net",
        "layers": [],
        "activations": acts,
        "input": {"finite": True, "rms": 2.0, "absmax": 2.0},
    }
    check = ModelCheck(event, None, Settings())
    # fc4 sits right before the norm: left out of the growth, which peaks at fc3.
    assert (check.growth, check.growth_at) == (pytest.approx(2.0e4 / 2.0), "fc3")
    assert check.chain == pytest.approx(10.0) and check.chain_names == [f"fc{i}" for i in range(5)]
    finding = model_findings(check)[0]
    assert finding.severity == "error" and finding.category == "initialization"


def test_parameter_writes_stop_at_an_optimizer_step_without_any_forward():
    writes = ParameterWrites()
    writes.start()
    try:
        weight = torch.zeros(3, requires_grad=True)
        optimizer = torch.optim.SGD([weight], lr=0.1)
        for _ in range(2):
            loss = ((weight - 1) ** 2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert not writes.active
    finally:
        writes.stop()
    from torch.overrides import _get_current_function_mode_stack

    assert writes not in _get_current_function_mode_stack()


def test_weights_born_outside_an_ops_domain_are_the_init_at_the_line_that_set_them(nandoctor):
    # A zero-initialised layer wrapped in weight_norm: g * v / ||v|| is 0/0 at the first
    # forward. Only weights went into the op, and no update had touched them.
    script = "init_weight_norm_zero.py"
    result = nandoctor("run", script, *STAGES)
    first = result.report["first_nonfinite"]
    assert (first["phase"], first["op"]) == ("forward", "aten._weight_norm_interface.default")
    assert "zero direction" in first["explanation"]
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("initialization", "IN102")
    assert cause["location"]["line"] == line_of(script, "the line to fix")


def test_a_parameter_never_initialized_is_located_where_it_was_created(nandoctor):
    # A CRF's transition scores made with torch.empty and never filled: a bare Parameter of
    # the user's own module, not a layer the scale check knows, and 1-D.
    script = "init_uninitialized_crf.py"
    result = nandoctor("run", script, *STAGES)
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("initialization", "IN302")
    assert cause["location"]["line"] == line_of(script, "the line to fix")
    assert any("crf.start (5,)" in line for line in cause["evidence"])


def test_memory_allocated_uninitialized_and_never_written_reads_as_nan(nandoctor):
    # F.normalize of whatever the allocator left is finite in a long-lived process: the run
    # must not be called healthy because of that. The buffer made the same way and zeroed
    # before use is not named.
    script = "init_empty_prototypes.py"
    result = nandoctor("run", script, *STAGES)
    assert result.exit_code == 1
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("initialization", "IN302")
    assert cause["location"]["line"] == line_of(script, "the line to fix")
    assert "allocated uninitialized" in cause["evidence"][0]
    assert not any("center" in line for line in cause["evidence"])


def test_weights_set_from_computed_values_are_located_where_the_values_were_made(nandoctor):
    # `model[2].bias = nn.Parameter(prior_log_odds(labels))`: the -inf is made inside the
    # script's own function, by the log of a label's zero count; the write stays as evidence.
    script = "init_log_prior_bias_empty_class.py"
    result = nandoctor("run", script, *STAGES)
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("initialization", "IN302")
    assert cause["location"]["line"] == line_of(script, "the line to fix")
    written = line_of(script, "model[2].bias = nn.Parameter")
    assert any("set at" in line and f"{script}:{written}" in line for line in cause["evidence"])
    assert "computed non-finite at line" in cause["fix"]
