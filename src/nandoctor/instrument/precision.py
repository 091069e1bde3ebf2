"""Which reduced precisions a model actually computes in: float16/bfloat16 parameters, an
autocast region around its forward, TF32 matmuls and convolutions on CUDA. `is_reduced` reads a
recorded state in the parent process, which never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REDUCED_DTYPES = ("float16", "bfloat16")


def precision_in_use(module: torch.nn.Module, param_dtypes: tuple[str, ...]) -> dict:
    """What `module`'s forward is about to compute in. `param_dtypes` are its floating parameter
    dtypes (the caller caches them: listing a large model's parameters every call costs)."""
    import torch

    autocast = [f"{device}:{str(torch.get_autocast_dtype(device)).removeprefix('torch.')}"
                for device in ("cpu", "cuda") if torch.is_autocast_enabled(device)]  # fmt: skip
    on_cuda = _first_parameter_device(module) == "cuda"
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


def _first_parameter_device(module: torch.nn.Module) -> str | None:
    parameter = next(module.parameters(), None)
    return parameter.device.type if parameter is not None else None


def _tf32_enabled() -> bool:
    import torch

    # cuDNN convolutions default to TF32 on Ampere and newer; matmuls follow either switch.
    return (
        torch.backends.cuda.matmul.allow_tf32
        or torch.get_float32_matmul_precision() != "highest"
        or torch.backends.cudnn.allow_tf32
    )
