"""What an aten op is, read from its schema, for running it again elsewhere: which arguments it
writes, whether it is random, a view or computes nothing, and how to collect its results."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

# Outputs that are uninitialized memory or another tensor's storage, and ops that compute
# nothing (aliases, host reads, plain copies): never compared.
_NOT_COMPUTED = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set", "resize",
    "resize_as", "_resize_output", "lift_fresh", "lift_fresh_copy", "detach", "alias",
    "_local_scalar_dense", "record_stream", "_has_same_storage_numel", "clone", "_unsafe_view",
    "_reshape_alias",
}  # fmt: skip
# Random ops, also where a torch version of the supported range lacks the
# `nondeterministic_seeded` tag. Running one again would draw from the script's generator.
_RANDOM = {
    "bernoulli", "native_dropout", "_fused_dropout", "rrelu_with_noise", "normal", "uniform",
    "exponential", "geometric", "cauchy", "log_normal", "random", "rand", "randn", "randint",
    "randperm", "rand_like", "randn_like", "randint_like", "multinomial", "poisson", "binomial",
    "_standard_gamma", "_sample_dirichlet",
}  # fmt: skip
# Conversions: an exact copy unless the dtype changes (then it can overflow: fp32 -> fp16).
CONVERSIONS = {"_to_copy", "copy", "_copy_from"}
# Fused attention kernels of accelerators that the CPU lacks: the math kernel is their reference.
ACCELERATOR_ATTENTION = {
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}  # fmt: skip
# Ops that TF32 runs at a ~10-bit mantissa on Ampere+ GPUs when it is allowed.
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "addmv", "mv"}
CONV_OPS = {"convolution", "_convolution", "cudnn_convolution", "conv1d", "conv2d", "conv3d"}
# Views whose size argument is all they need: `reshape` takes them of any copy of the input.
RESHAPES = {"view", "_unsafe_view", "reshape", "_reshape_alias"}
# Views that only rearrange: they can be taken of a copy of their input as well.
SHAPE_VIEWS = RESHAPES | {
    "expand", "t", "transpose", "permute",
    "squeeze", "unsqueeze", "select", "slice", "narrow", "alias", "detach", "unbind", "split",
    "split_with_sizes", "chunk", "view_as_real", "view_as_complex", "unflatten", "flatten",
}  # fmt: skip


# Collectives of torch.distributed (DDP's all-reduce among them) as the dispatcher names them.
_COMMUNICATION_NAMESPACES = {"c10d", "_c10d_functional", "c10d_functional", "_dtensor"}


@dataclass(frozen=True)
class OpPlan:
    """What an op overload is; computed once per overload."""

    name: str  # `exp`, `add` (trailing underscore of in-place ops removed)
    skip: str | None  # why it is never compared
    writes: tuple[tuple[int, str], ...]  # (position, name) of the arguments it mutates
    aliased_returns: tuple[bool, ...]  # per schema return: aliases an argument
    dropout_arg: tuple[int, str] | None  # a fused-attention op is random only when this is > 0


def plan_of(func) -> OpPlan:
    schema = func._schema
    packet = func.overloadpacket.__name__
    name = packet.rstrip("_") or packet
    writes = tuple(
        (i, a.name)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    aliased = tuple(r.alias_info is not None for r in schema.returns)
    dropout = next(
        ((i, a.name) for i, a in enumerate(schema.arguments) if a.name == "dropout_p"), None
    )
    random = torch.Tag.nondeterministic_seeded in func.tags or name in _RANDOM
    skip = None
    if func.namespace in _COMMUNICATION_NAMESPACES:
        skip = "communication"  # run again on the reference, it would talk to the other ranks
    elif name in _NOT_COMPUTED:
        skip = "not computed"
    elif random and dropout is None:
        skip = "random"
    elif not writes and aliased and all(aliased):
        skip = "view"
    elif not writes and not any("Tensor" in str(r.type) for r in schema.returns):
        skip = "no tensor output"
    return OpPlan(name, skip, writes, aliased, dropout if random else None)


def argument(args, kwargs, position: int, name: str, default=None):
    """An op argument by schema position, passed positionally or by keyword."""
    if position < len(args):
        return args[position]
    return kwargs.get(name, default)


def is_floating(t) -> bool:
    """A dense floating or complex tensor with elements: what can be compared."""
    return (
        isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and t.layout == torch.strided
        and t.numel() > 0
    )


def tensors_in(value) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def upcast(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else dtype


def is_exact_copy(plan: OpPlan, args, kwargs) -> bool:
    """A conversion that keeps the dtype (a device move, a plain copy) cannot change a value."""
    if plan.name == "_to_copy":
        dtype = kwargs.get("dtype")
        return dtype is None or dtype == args[0].dtype
    source = args[1] if len(args) > 1 else None
    return isinstance(source, torch.Tensor) and source.dtype == args[0].dtype


def results_of(plan: OpPlan, out, args, kwargs) -> list:
    """The tensors an op produced: its own returns (not those aliasing a written argument),
    then the arguments it wrote (in-place and out= ops)."""
    if plan.name in ACCELERATOR_ATTENTION:
        return [out[0]]
    returned = list(out) if isinstance(out, (tuple, list)) else [out]
    if plan.writes:
        if len(plan.aliased_returns) == len(returned):
            returned = [
                r for r, aliased in zip(returned, plan.aliased_returns, strict=True) if not aliased
            ]
        elif plan.aliased_returns and plan.aliased_returns[0]:
            returned = []  # one `Tensor(a!)[]` return: the written list itself
    results = tree_flatten(returned)[0]
    for position, name in plan.writes:
        results += tree_flatten(argument(args, kwargs, position, name))[0]
    return results


def pair_up(targets: list, references: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(target, reference) results to compare: floating, same shape, in the same order."""
    if len(targets) != len(references):
        return []
    return [
        (t, r)
        for t, r in zip(targets, references, strict=True)
        if is_floating(t) and isinstance(r, torch.Tensor) and r.shape == t.shape
    ]


def attention_reference(plan: OpPlan, args, kwargs) -> tuple[torch.Tensor]:
    """An accelerator's fused attention computed by the math kernel (its output 0 only)."""
    query, key, value = args[:3]
    flash = plan.name == "_scaled_dot_product_flash_attention"
    mask = None if flash else args[3]
    causal = bool(argument(args, kwargs, 4 if flash else 6, "is_causal", False))
    output = torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, mask, 0.0, causal, scale=kwargs.get("scale")
    )[0]
    return (output,)
