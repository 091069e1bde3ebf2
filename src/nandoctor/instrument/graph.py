"""The leaf tensors a backward pass will write gradients into, read from the autograd graph."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def leaves_reached_by(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Every leaf tensor whose `.grad` a backward pass from `tensors` accumulates into.

    Module parameters are found through the modules, but a learnable temperature, a latent code,
    an adversarial perturbation or a hand-rolled layer's weight is a bare leaf that only the
    graph knows. Each `AccumulateGrad` node holds its leaf as `variable`; the walk visits every
    node once (a few microseconds each) and must run before backward frees the graph.
    """
    found: dict[int, torch.Tensor] = {}
    pending = [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    pending += [t for t in tensors if isinstance(t, torch.Tensor) and _is_grad_leaf(t)]
    seen: set = set()  # the nodes themselves: an id could be reused once a node is freed
    while pending:
        node = pending.pop()
        if isinstance(node, torch.Tensor):  # backward() called on a leaf itself
            found[id(node)] = node
            continue
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)
        if isinstance(leaf, torch.Tensor):  # an AccumulateGrad node
            found[id(leaf)] = leaf
            continue
        pending.extend(next_node for next_node, _ in node.next_functions)
    return list(found.values())


def _is_grad_leaf(t: torch.Tensor) -> bool:
    return t.requires_grad and t.grad_fn is None
