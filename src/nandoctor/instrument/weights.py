"""Scale statistics of a model at initialization: per-layer weight scale against PyTorch's
default init, recurrent spectral norms, and activation scale per module output.

kappa = rms(W) * sqrt(fan_in) is the factor by which a layer scales the RMS of a unit-variance
input (before any activation); it equals std(W) * sqrt(fan_in) for zero-mean weights, and it
also sees a constant offset that std would miss. PyTorch's default init gives kappa = 1/sqrt(3)
for Linear and ConvNd, He/Kaiming for ReLU gives sqrt(2), LeCun gives 1.
"""

from __future__ import annotations

import math

import torch
from torch import nn

DEFAULT_KAPPA = 1 / math.sqrt(3)  # Linear/ConvNd (kaiming_uniform_, a=sqrt(5)) and RNN weights
ATTENTION_KAPPA = 1 / math.sqrt(2)  # MultiheadAttention in_proj: xavier_uniform_ on (3E, E)
_SVD_LIMIT = 1024  # larger recurrent matrices use power iteration
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)
_RMS_NORM = getattr(nn, "RMSNorm", None)
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def layer_kind(module: nn.Module) -> str | None:
    """linear | conv | embedding | rnn | attention | norm, or None for other modules."""
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.modules.conv._ConvNd):
        return "conv"
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    if isinstance(module, nn.RNNBase):
        return "rnn"
    if isinstance(module, nn.MultiheadAttention):
        return "attention"
    if isinstance(module, _NORMS) or (_RMS_NORM is not None and isinstance(module, _RMS_NORM)):
        return "norm"
    return None


def rms(t: torch.Tensor) -> float:
    """Root mean square; recomputed in float64 when the sum of squares overflows the dtype
    (values near the float32 limit), so huge activations read as huge, not as Inf."""
    x = t.detach()
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    size = math.sqrt(max(x.numel(), 1))
    value = float(torch.linalg.vector_norm(x)) / size
    if math.isfinite(value) or not bool(torch.isfinite(x).all()):
        return value
    return float(torch.linalg.vector_norm(x.double())) / size


def fan_in(weight: torch.Tensor) -> int:
    """Fan-in as `torch.nn.init` computes it: size(1) times the receptive field."""
    receptive = math.prod(weight.shape[2:]) if weight.dim() > 2 else 1
    return int(weight.shape[1] * receptive) if weight.dim() >= 2 else int(weight.shape[0])


def spectral_norm(matrix: torch.Tensor, iterations: int = 100) -> float:
    """Largest singular value: exact up to `_SVD_LIMIT` rows, power iteration above."""
    m = matrix.detach().double()
    if max(m.shape) <= _SVD_LIMIT:
        return float(torch.linalg.svdvals(m)[0])
    v = torch.ones(m.shape[1], dtype=m.dtype, device=m.device) / math.sqrt(m.shape[1])
    for _ in range(iterations):
        v = m.T @ (m @ v)
        v = v / torch.linalg.vector_norm(v).clamp_min(1e-300)
    return float(torch.linalg.vector_norm(m @ v))


def weight_record(name: str, weight: torch.Tensor, default_kappa: float | None, fan=None) -> dict:
    """Scale of one weight tensor; `fan` overrides the fan-in (RNNs use hidden_size)."""
    w = weight.detach()
    finite = bool(torch.isfinite(w).all())
    record = {"param": name, "shape": list(w.shape), "numel": w.numel(), "finite": finite}
    if not finite or w.numel() == 0:
        return record
    std, mean = torch.std_mean(w.double(), correction=0)
    scale = rms(w)
    n = fan if fan is not None else fan_in(w)
    record.update(
        fan_in=n,
        rms=scale,
        std=float(std),
        mean=float(mean),
        constant=bool(w.min() == w.max()),
        zero=scale == 0.0,
    )
    if default_kappa is not None:
        record.update(kappa=scale * math.sqrt(n), default_kappa=default_kappa)
    return record


def describe_layer(name: str, module: nn.Module, kind: str) -> dict:
    """The weights of one layer: what the init check compares against the defaults."""
    layer = {"name": name, "type": type(module).__name__, "kind": kind, "weights": []}
    if kind in ("linear", "conv"):
        layer["weights"].append(weight_record(f"{name}.weight", module.weight, DEFAULT_KAPPA))
    elif kind == "embedding":
        layer["weights"].append(weight_record(f"{name}.weight", module.weight, None))
    elif kind == "attention":
        for pname in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
            w = getattr(module, pname, None)
            if isinstance(w, torch.Tensor):
                layer["weights"].append(weight_record(f"{name}.{pname}", w, ATTENTION_KAPPA))
    elif kind == "rnn":
        layer.update(_rnn_weights(name, module))
    elif kind == "norm":
        layer.update(_norm_state(module))
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor) and bias.numel() and bool(torch.isfinite(bias).all()):
        layer["bias_rms"] = rms(bias)
    return layer


def _rnn_weights(name: str, module: nn.RNNBase) -> dict:
    hidden = module.hidden_size
    gates = _GATES.get(module.mode, 1)
    weights, sigmas = [], []
    for pname, p in module.named_parameters():
        if not pname.startswith("weight_"):
            continue
        weights.append(weight_record(f"{name}.{pname}", p, DEFAULT_KAPPA, fan=hidden))
        if pname.startswith("weight_hh") and bool(torch.isfinite(p).all()):
            rows = p.shape[0] // gates
            blocks = [p[i * rows : (i + 1) * rows] for i in range(gates)]
            sigmas.append(
                {"param": f"{name}.{pname}", "sigma_max": max(map(spectral_norm, blocks))}
            )
    return {"weights": weights, "recurrent": sigmas, "mode": module.mode}


def _norm_state(module: nn.Module) -> dict:
    state = {}
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.numel():
        state["gamma_rms"] = rms(weight)
        state["gamma_zero"] = bool((weight == 0).all())
    running_var = getattr(module, "running_var", None)
    if isinstance(running_var, torch.Tensor) and running_var.numel():
        state["running_var_min"] = float(running_var.min())
        state["running_var_finite"] = bool(torch.isfinite(running_var).all())
    return state


def first_tensor(value) -> torch.Tensor | None:
    """The first tensor of a module's input or output (LSTM returns (out, (h, c)))."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            if (found := first_tensor(item)) is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            if (found := first_tensor(item)) is not None:
                return found
    return None


def activation_record(t: torch.Tensor | None) -> dict | None:
    """RMS and largest magnitude of a floating tensor, with its non-finite counts if any."""
    if t is None or not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return None
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    finite = bool(torch.isfinite(x).all())
    if not finite:
        from nandoctor.instrument.tensors import count_nonfinite

        good = x[torch.isfinite(x)]
        return {
            "finite": False,
            "nonfinite": count_nonfinite(x).describe(),
            "rms": rms(good) if good.numel() else None,
        }
    return {"finite": True, "rms": rms(x), "absmax": float(x.abs().max())}
