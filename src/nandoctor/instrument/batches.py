"""Summaries of the tensors in a batch: two reductions per tensor, plain Python values out.

A batch is any nesting of tensors, tuples, lists, dicts and dataclasses; every tensor leaf gets
a summary. Dim 0 is read as the sample dimension and dim 1 as the feature/channel dimension.
The common case (all values finite, no constant sample) costs three fast reductions and one
device sync; exact counts and positions are computed only when something is wrong.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping

import torch

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_MAX_DEPTH = 6


def iter_leaves(value, path: str = "batch", limit: int = 64) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in a nested batch: `batch[0]`, `batch['x']`, `batch.x`."""
    return itertools.islice(_walk(value, path, 0), limit)


def _walk(value, path: str, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if depth >= _MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        for key, item in zip(value._fields, value, strict=False):
            yield from _walk(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]", depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from _walk(getattr(value, item.name), f"{path}.{item.name}", depth + 1)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """The tensor as (samples, values per sample)."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.reshape(x.shape[0], -1)


def _first(mask: torch.Tensor, limit: int) -> list[int]:
    return mask.nonzero().flatten()[:limit].tolist()


def summarize(t: torch.Tensor, magnitude: float, limit: int = 8) -> dict:
    """Counts of NaN/+Inf/-Inf, min/max/mean/std of the finite values, samples that are all
    zero or constant, values with |x| > `magnitude`; the positions of what is wrong (first
    `limit` sample indices, feature indices along dim 1, the first bad element).

    The common case costs three fast reductions (per-sample sum and L2 norm, tensor-wide
    aminmax) and one device sync; NaN/Inf make both per-sample reductions non-finite, and an
    all-zero or constant sample has a zero spread n*sum(x^2) - sum(x)^2. Exact counts and
    positions are computed only for a tensor where one of these says something is wrong. The
    std comes from the sums (approximate when |mean| >> std).
    """
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    summary = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    if x.numel() == 0 or x.dtype == torch.bool:
        return summary
    if not x.is_floating_point():
        return {**summary, **_integer_stats(x)}
    rows = _rows(x)
    if x.dtype in _LOW_PRECISION:  # half-precision sums of many values would overflow
        rows = rows.float()
    per_sample = rows.shape[1]
    sums = rows.sum(dim=1)
    norms = torch.linalg.vector_norm(rows, dim=1)
    low, high = torch.aminmax(rows)
    squares = norms.double() ** 2
    spread = per_sample * squares - sums.double() ** 2  # n^2 * variance of each sample
    maybe_constant = spread <= 1e-5 * per_sample * squares  # confirmed exactly below
    bad_row = ~(torch.isfinite(sums) & torch.isfinite(norms))
    packed = torch.stack(
        [
            low.double(),
            high.double(),
            sums.double().sum(),
            squares.sum(),
            bad_row.sum().double(),
            maybe_constant.sum().double(),
        ]
    ).tolist()
    vmin, vmax, total, total_squares, n_bad, n_maybe_constant = packed
    count = rows.numel()
    mean = total / count
    std = math.sqrt(max(total_squares / count - mean * mean, 0.0))
    summary.update(samples=rows.shape[0], min=vmin, max=vmax, mean=mean, std=std)
    if n_bad:  # NaN/Inf, or finite values whose squares overflowed: count exactly
        summary.update(_nonfinite_stats(x, rows, limit))
    if per_sample > 1 and n_maybe_constant:
        summary.update(_constant_stats(rows, maybe_constant, limit))
    largest = max(abs(summary["min"] or 0.0), abs(summary["max"] or 0.0))
    if largest > magnitude:
        summary.update(_magnitude_stats(rows, magnitude, limit))
    return summary


def _constant_stats(rows: torch.Tensor, candidates: torch.Tensor, limit: int) -> dict:
    """Samples whose values are all equal (exact min == max over the candidate rows)."""
    index = candidates.nonzero().flatten()
    low, high = torch.aminmax(rows[index], dim=1)
    constant = index[low == high]  # a NaN sample is never equal to itself
    if constant.numel() == 0:
        return {}
    zero = int((low[low == high] == 0).sum())
    return {
        "constant_samples": constant.numel(),
        "zero_samples": zero,
        "constant_at": constant[:limit].tolist(),
    }


def _integer_stats(x: torch.Tensor) -> dict:
    rows = _rows(x)
    low, high = torch.aminmax(rows)
    std, mean = torch.std_mean(rows.double(), correction=0)  # labels and ids: small tensors
    vmin, vmax, vmean, vstd = torch.stack([low.double(), high.double(), mean, std]).tolist()
    return {"samples": rows.shape[0], "min": vmin, "max": vmax, "mean": vmean, "std": vstd}


def _nonfinite_stats(x: torch.Tensor, rows: torch.Tensor, limit: int) -> dict:
    """Exact counts and positions, and the finite values' statistics; runs only for a tensor
    whose fast check was not finite."""
    nan, posinf, neginf = torch.isnan(rows), torch.isposinf(rows), torch.isneginf(rows)
    bad = nan | posinf | neginf
    finite = rows[~bad].double()
    stats: dict = {}
    if finite.numel():
        std, mean = torch.std_mean(finite, correction=0)
        low, high = torch.aminmax(finite)
        stats.update(min=float(low), max=float(high), mean=float(mean), std=float(std))
    else:
        stats.update(min=None, max=None, mean=None, std=None)
    if not bool(bad.any()):  # only the float32 sums overflowed
        return stats
    stats.update(
        nan=int(nan.sum()),
        posinf=int(posinf.sum()),
        neginf=int(neginf.sum()),
        bad_samples=int(bad.any(dim=1).sum()),
        bad_at=_first(bad.any(dim=1), limit),
        first_bad=_unravel(int(bad.flatten().nonzero()[0]), list(x.shape)),
    )
    if x.dim() >= 2:
        per_feature = bad.reshape(x.shape[0], x.shape[1], -1).any(dim=2).any(dim=0)
        stats["bad_features"] = _first(per_feature, limit)
    return stats


def _magnitude_stats(rows: torch.Tensor, magnitude: float, limit: int) -> dict:
    big = (rows.abs() > magnitude) & torch.isfinite(rows)
    big_row = big.any(dim=1)
    return {
        "big_values": int(big.sum()),
        "big_samples": int(big_row.sum()),
        "big_at": _first(big_row, limit),
        "largest": float(rows[big].abs().max()),
    }


def _unravel(flat_index: int, shape: list[int]) -> list[int]:
    position = []
    for size in reversed(shape):
        position.append(flat_index % size)
        flat_index //= size
    return list(reversed(position))


def class_dim_size(logits: torch.Tensor) -> int:
    """C for cross_entropy / nll_loss: dim 1 of a batched input, dim 0 of an unbatched one."""
    return int(logits.shape[1] if logits.dim() >= 2 else logits.shape[0])


def check_class_targets(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, limit: int = 8
) -> dict | None:
    """Class-index targets against [0, C), C from the logits; targets equal to `ignore_index`
    are left out. None for probability targets (floating point), which have no classes."""
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.numel() == 0:
        return None
    classes = class_dim_size(logits)
    t = target.detach()
    ignored = t == ignore_index
    outside = ((t < 0) | (t >= classes)) & ~ignored
    kept = t[~ignored]
    low, high = torch.aminmax(kept) if kept.numel() else (t.new_zeros(()), t.new_zeros(()))
    n_outside, n_ignored, vlow, vhigh = torch.stack(
        [outside.sum(), ignored.sum(), low.long(), high.long()]
    ).tolist()
    result = {
        "classes": classes,
        "ignore_index": ignore_index,
        "targets": t.numel(),
        "ignored": n_ignored,
        "out_of_range": n_outside,
        "min": vlow if kept.numel() else None,
        "max": vhigh if kept.numel() else None,
    }
    if n_outside:
        per_sample = outside.reshape(t.shape[0], -1).any(dim=1) if t.dim() else outside.reshape(1)
        result["bad_at"] = _first(per_sample, limit)
        result["bad_values"] = sorted(set(t[outside].unique()[:limit].tolist()))
    return result
