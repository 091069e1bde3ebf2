"""Which dataset indices a DataLoader batch holds: the sampler's indices, matched to batches.

`_BaseDataLoaderIter._next_index` draws the indices of one batch from the sampler. A
single-process iterator fetches each batch right after drawing its indices; a multi-process
iterator draws ahead (prefetch) and sends each draw as task `_send_idx`, and with
`in_order=True` (the default) hands batches back in task order, so the batch just returned is
task `_rcvd_idx - 1`. Out-of-order loading gives no mapping (None).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch

_TASKS = "_nandoctor_tasks"  # task index -> sampler indices, on a multi-process iterator
_LAST = "_nandoctor_last_index"  # the last draw of a single-process iterator


@dataclass
class LoadedBatch:
    """What is known about the batch a DataLoader iterator just returned."""

    batch_id: int  # id() of the returned object
    dataset: object
    indices: object  # list of dataset indices, one int (no auto-collation) or None
    collated: bool  # dim 0 of each tensor is the sample dimension


def watch_loader_batches(on_batch: Callable[[LoadedBatch], None]) -> Callable[[], None]:
    """Call `on_batch` after every batch any DataLoader iterator returns; returns the undo."""
    iterator_class = torch.utils.data.dataloader._BaseDataLoaderIter
    original_next_index = iterator_class._next_index
    original_next = iterator_class.__next__

    def next_index(iterator):
        index = original_next_index(iterator)  # StopIteration passes through
        tasks = iterator.__dict__.get(_TASKS)
        if hasattr(iterator, "_send_idx"):
            if tasks is None:
                tasks = iterator.__dict__[_TASKS] = {}
            tasks[iterator._send_idx] = index
        else:
            iterator.__dict__[_LAST] = index
        return index

    def next_batch(iterator):
        batch = original_next(iterator)
        try:
            indices = _indices_of(iterator)
            collated = bool(iterator._auto_collation)
        except AttributeError:  # an iterator class of another torch version
            indices, collated = None, True
        on_batch(LoadedBatch(id(batch), iterator._dataset, indices, collated))
        return batch

    iterator_class._next_index = next_index
    iterator_class.__next__ = next_batch

    def undo() -> None:
        iterator_class._next_index = original_next_index
        iterator_class.__next__ = original_next

    return undo


def _indices_of(iterator) -> object:
    tasks = iterator.__dict__.get(_TASKS)
    if tasks is None:
        return iterator.__dict__.pop(_LAST, None)
    if not getattr(iterator, "_in_order", True):
        tasks.clear()
        return None
    task = iterator._rcvd_idx - 1
    for stale in [key for key in tasks if key < task]:
        del tasks[stale]
    return tasks.pop(task, None)


def dataset_index(loaded: LoadedBatch | None, sample: int) -> int | None:
    """The dataset index of sample `sample` of the batch, when the sampler gave plain ints."""
    if loaded is None or loaded.indices is None:
        return None
    indices = loaded.indices
    if not loaded.collated:
        return _as_int(indices)
    if isinstance(indices, (list, tuple)) and sample < len(indices):
        return _as_int(indices[sample])
    return None


def _as_int(value) -> int | None:
    """Samplers yield ints, numpy ints or 0-d tensors; anything else has no dataset index."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def is_map_style(dataset) -> bool:
    return not isinstance(dataset, torch.utils.data.IterableDataset) and hasattr(
        dataset, "__getitem__"
    )
