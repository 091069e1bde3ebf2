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
