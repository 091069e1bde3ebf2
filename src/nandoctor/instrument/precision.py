"""Which reduced precisions a model actually computes in: float16/bfloat16 parameters, an
autocast region around its forward, TF32 matmuls and convolutions on CUDA. `is_reduced` reads a
recorded state in the parent process, which never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nandoctor.instrument.kinds import CONSTANT_OVERFLOW, OVERFLOW

if TYPE_CHECKING:
    import torch

REDUCED_DTYPES = ("float16", "bfloat16")
# The same, as the labels an op's computing dtype gets (float32 matmuls under TF32: "tf32").
REDUCED_LABELS = (*REDUCED_DTYPES, "tf32")


def overflowed_reduced_precision(kind: str | None, dtype: str | None) -> bool:
    """An op computing in float16 or bfloat16 made an Inf from finite inputs (a result, or a
    constant of its formula, beyond the dtype's range): made by the dtype, whatever phase the
    op ran in, not carried by the data."""
    return kind in (OVERFLOW, CONSTANT_OVERFLOW) and dtype in REDUCED_DTYPES


def precision_in_use(device: str | None, param_dtypes: tuple[str, ...]) -> dict:
    """What a model whose parameters live on `device` ("cpu", "cuda") is about to compute in.
    `param_dtypes` are its floating parameter dtypes (the caller caches them: listing a large
    model's parameters every call costs)."""
    import torch

    autocast = [f"{kind}:{str(torch.get_autocast_dtype(kind)).removeprefix('torch.')}"
                for kind in ("cpu", "cuda") if torch.is_autocast_enabled(kind)]  # fmt: skip
    on_cuda = device == "cuda"
    return {
        "param_dtypes": list(param_dtypes),
        "autocast": autocast,
        "tf32": on_cuda and "float32" in param_dtypes and _tf32_enabled(),
    }


def floating_param_dtypes(module: torch.nn.Module) -> tuple[str, ...]:
    dtypes = {str(p.dtype).removeprefix("torch.") for p in module.parameters()
              if p.is_floating_point()}  # fmt: skip
    return tuple(sorted(dtypes))


def is_reduced(state: dict) -> bool:
    """True when the state computes something below float32: float16/bfloat16 parameters, an
    autocast region (float16 or bfloat16), or TF32."""
    return (
        any(dtype in REDUCED_DTYPES for dtype in state.get("param_dtypes", ()))
        or bool(state.get("autocast"))
        or bool(state.get("tf32"))
    )


def _tf32_enabled() -> bool:
    import torch

    # cuDNN convolutions default to TF32 on Ampere and newer; matmuls follow either switch.
    return (
        torch.backends.cuda.matmul.allow_tf32
        or torch.get_float32_matmul_precision() != "highest"
        or torch.backends.cudnn.allow_tf32
    )
