"""nandoctor inside the user's own code: guard(), watch() and the pytest plugin."""

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import nandoctor  # noqa: E402


def _step(model, optimizer, x):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def test_guard_raises_at_the_birth_with_op_line_and_why():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.rand(8, 3)
    x[5] = 0.0
    with pytest.raises(nandoctor.NonFiniteError) as caught, nandoctor.guard():
        for _ in range(3):
            normalized = x / x.sum(dim=1, keepdim=True)  # the birth: 0/0 in row 5
            _step(model, optimizer, normalized)
    error = caught.value
    assert error.op == "aten.div.Tensor"
    assert error.location.code.startswith("normalized = x / x.sum(dim=1, keepdim=True)")
    assert "division by zero: 1 of 8 denominators are 0" in error.explanation
    assert error.reached == "the loss" and error.step == 0
    assert "x / x.sum(dim=1, keepdim=True)" in str(error)


def test_guard_lets_masked_infinities_pass_and_cleans_up():
    before = (torch.autograd.backward, torch.optim.Optimizer.__init__, torch.from_numpy)
    scores = nn.Parameter(torch.randn(4, 4))
    optimizer = torch.optim.SGD([scores], lr=0.1)
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    with nandoctor.guard():
        for _ in range(3):
            attention = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            loss = attention.pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert (torch.autograd.backward, torch.optim.Optimizer.__init__, torch.from_numpy) == before
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None


def test_watch_catches_a_nan_loss_cheaply_and_names_the_step():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with nandoctor.watch(model, optimizer) as watching:
        _step(model, optimizer, x)
        _step(model, optimizer, x)
        assert watching.steps == 2
        x[0, 0] = float("nan")
        with pytest.raises(nandoctor.NonFiniteError, match="reached the loss at step 2"):
            _step(model, optimizer, x)


def test_pytest_plugin_fails_a_test_whose_nan_goes_unnoticed(tmp_path):
    (tmp_path / "test_training.py").write_text(
        textwrap.dedent("""
        import torch

        def test_normalized_step():
            model = torch.nn.Linear(3, 1)
            x = torch.rand(4, 3)
            x[2] = 0.0
            loss = model(x / x.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
    """)
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    plain = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    guarded = subprocess.run(
        [*command, "--nandoctor"], capture_output=True, text=True, cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stdout
    assert guarded.returncode == 1
    assert "NonFiniteError: NaN/Inf born in aten.div.Tensor at test_training.py:8" in guarded.stdout


# NaN/Inf reaching leaves that no module owns: learnable temperatures, latent codes, adversarial
# perturbations and hand-rolled layers live in such tensors.


def test_guard_catches_an_inf_gradient_of_a_bare_parameter():
    w = nn.Parameter(torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(nandoctor.NonFiniteError) as caught, nandoctor.guard():
        torch.sqrt(w).sum().backward()
    error = caught.value
    assert error.phase == "backward"
    assert error.location.code == "torch.sqrt(w).sum().backward()"
    assert "derivative of sqrt(x) is infinite at x = 0" in error.explanation
    assert error.reached.startswith("the gradient of")


def test_guard_names_the_same_birth_for_a_bare_leaf_as_for_a_module_parameter():
    def birth_of(leaf):
        with pytest.raises(nandoctor.NonFiniteError) as caught, nandoctor.guard():
            torch.where(leaf > 0, torch.log(leaf), 0.0).sum().backward()
        error = caught.value
        return error.op, error.phase, error.location.line, error.explanation.split("; it")[0]

    bare = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
    layer = nn.Linear(3, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0, 2.0]]))
    op, phase, _, why = birth_of(bare)
    assert birth_of(bare) == birth_of(layer.weight)
    assert phase == "backward" and "log" in why


def test_watch_catches_a_nan_gradient_of_a_plain_requires_grad_tensor():
    t = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
    with (
        pytest.raises(nandoctor.NonFiniteError, match="reached the gradient of"),
        nandoctor.watch(),
    ):
        torch.where(t > 0, torch.log(t), 0.0).sum().backward()


def test_guard_and_watch_catch_a_parameter_only_an_optimizer_updates():
    def train(context):
        code = torch.zeros(4, requires_grad=True)  # a latent code no module holds
        optimizer = torch.optim.Adam([code], lr=0.1, eps=0.0)
        with pytest.raises(nandoctor.NonFiniteError) as caught, context():
            for _ in range(3):
                loss = (code * 0.0).sum()  # a zero gradient: Adam divides 0 by sqrt(0) + 0
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return caught.value

    guarded = train(nandoctor.guard)
    assert guarded.phase == "optimizer" and guarded.step == 0
    assert guarded.reached.startswith("parameter")
    watched = train(nandoctor.watch)
    assert watched.step == 0 and watched.reached.startswith("parameter")


def test_pytest_plugin_fails_a_test_whose_bare_parameter_gets_a_nan_gradient(tmp_path):
    (tmp_path / "test_temperature.py").write_text(
        textwrap.dedent("""
        import torch

        def test_safe_log_of_a_temperature():
            w = torch.nn.Parameter(torch.tensor([1.0, 0.0, 2.0]))
            torch.where(w > 0, torch.log(w), 0.0).sum().backward()
    """)
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    plain = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    guarded = subprocess.run(
        [*command, "--nandoctor"], capture_output=True, text=True, cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stdout
    assert guarded.returncode == 1, guarded.stdout
    assert "test_temperature.py:6 (backward" in guarded.stdout


def _global_state():
    """Everything guard() and watch() patch or set while active."""
    import os

    from torch.nn.modules import module as module_hooks
    from torch.optim import optimizer as optimizer_hooks
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    loader_iter = torch.utils.data.dataloader._BaseDataLoaderIter
    return {
        "backward": torch.autograd.backward,
        "optimizer_init": torch.optim.Optimizer.__init__,
        "loader_next": loader_iter.__next__,
        "sources": [getattr(torch, n) for n in ("from_numpy", "as_tensor", "tensor", "load")],
        "compile": torch.compile,
        "scaler_scale": torch.amp.GradScaler.scale,
        "module_forward_hooks": len(module_hooks._global_forward_hooks),
        "module_pre_hooks": len(module_hooks._global_forward_pre_hooks),
        "optimizer_pre_hooks": len(optimizer_hooks._global_optimizer_pre_hooks),
        "optimizer_post_hooks": len(optimizer_hooks._global_optimizer_post_hooks),
        "dispatch_mode": _get_current_dispatch_mode(),
        "TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE", "<unset>"),
    }


@pytest.mark.parametrize("dynamo_switch", [None, "0"])
def test_guard_and_watch_restore_every_global_exactly_even_after_raising(monkeypatch,
                                                                         dynamo_switch):  # fmt: skip
    if dynamo_switch is None:
        monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TORCHDYNAMO_DISABLE", dynamo_switch)
    before = _global_state()
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with pytest.raises(nandoctor.NonFiniteError), nandoctor.guard():
        import os

        assert os.environ["TORCHDYNAMO_DISABLE"] == "1"  # compiled code runs eagerly inside
        torch.log(x).sum().backward()
    assert _global_state() == before
    with pytest.raises(nandoctor.NonFiniteError), nandoctor.watch():
        torch.log(x).sum().backward()
    assert _global_state() == before
