"""Data-parallel training on torch.distributed: one graph per process, gradients averaged in the graph.

Every process (launched by ``torchrun``, one per GPU, or several on a CPU
with gloo) builds the same graph. `data_parallel` turns a one-device training
step into a data-parallel one without touching the model code: the gradients
are averaged over the group by collective ops in the graph (ops/collective.py),
in buckets of about `bucket_bytes`; each bucket's all-reduce starts (without
waiting) as soon as the backward pass has built its last gradient, and is
waited for after the backward pass, so communication overlaps the rest of it. `synchronize_variables` makes every
process start from rank 0's values, `shard` splits a dataset into equal parts
per rank, and `save` writes a checkpoint once.

>>> import numpy as np, stitchml as sm
>>> g = sm.Graph(); w = g.variable(np.array([3.0]), name="w")
>>> steps = sm.optim.SGD(0.1).minimize(g, g.reduction_sum(w * w), [w], data_parallel="world")
>>> _ = g.run(target_ops=steps, device="cpu")  # one process: a group of one, the same step as before
>>> round(g.variable_value(w).item(), 6)
2.4
"""
from __future__ import annotations

import datetime
import os
from typing import Sequence

import numpy as np
import torch

from . import autodiff
from .errors import DeviceError, GraphError
from .ir import Tensor
from .ops.collective import WORLD, group_rank, group_size, process_group, register_group

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket size


def init(backend: str | None = None, timeout_s: float = 300.0) -> tuple[int, int]:
    """Join the process group that ``torchrun`` describes in the environment, if not joined yet.

    `backend` defaults to NCCL when CUDA is present and gloo otherwise. A process that waits longer
    than `timeout_s` for the others (one died) gets an error instead of hanging. On CUDA, each process
    uses the GPU of its ``LOCAL_RANK``. Returns (rank, world size); (0, 1) without torchrun's
    environment.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DeviceError("backend 'nccl' needs CUDA GPUs; use 'gloo' on CPUs")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def rank(group: str = WORLD) -> int:
    """This process's rank in `group` (0 in a single process)."""
    return group_rank(group)


def world_size(group: str = WORLD) -> int:
    """The number of processes in `group` (1 in a single process)."""
    return group_size(group)


def is_main(group: str = WORLD) -> bool:
    """True on the process that writes files and prints (rank 0)."""
    return group_rank(group) == 0


def barrier(group: str = WORLD) -> None:
    """Wait until every process of `group` gets here (nothing in a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=process_group(group))


def data_parallel(graph, loss: Tensor, variables: Sequence[Tensor], group: str = WORLD,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[Tensor, Tensor]:
    """The gradients of `loss` for `variables`, averaged over the processes of `group`.

    Each process computes the gradient of its own batch; the average over the group equals the
    gradient of the mean loss over the whole (concatenated) batch when the per-process batches have
    equal sizes. Gradients are packed into buckets of about `bucket_bytes` (one flat all-reduce per
    bucket and dtype), in the order the backward pass completes them: last layers first. Each
    bucket's all-reduce starts as soon as its last gradient is built and is waited for after the
    backward pass, so communication overlaps the rest of the backward pass.
    """
    if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes <= 0:
        raise GraphError(f"data_parallel: bucket_bytes must be a positive int, got {bucket_bytes!r}")
    if not isinstance(group, str):
        raise GraphError(f"data_parallel: group must be a process group's name, got {group!r}")
    buckets = _Buckets(graph, group, bucket_bytes)
    grads = autodiff.gradients(graph, loss, list(variables), on_ready=buckets.add)
    with graph.scope("gradients"):
        buckets.flush_all()
        buckets.finish()
    return {v: buckets.averaged.get(v.id, grads[v]) for v in variables}


class _Buckets:
    """Gradients waiting for their bucket's all-reduce, one open bucket per dtype."""

    def __init__(self, graph, group: str, limit: int):
        self.graph, self.group, self.limit = graph, group, limit
        self.open: dict[object, list[tuple[Tensor, Tensor]]] = {}
        self.averaged: dict[int, Tensor] = {}
        self.started: list[tuple[Tensor, list[tuple[Tensor, Tensor]]]] = []

    def add(self, variable: Tensor, gradient: Tensor) -> list[Tensor]:
        pending = self.open.setdefault(gradient.dtype, [])
        pending.append((variable, gradient))
        if sum(_nbytes(g) for _, g in pending) >= self.limit:
            return self.flush(gradient.dtype)
        return []

    def flush_all(self) -> None:
        for dtype in list(self.open):
            self.flush(dtype)

    def flush(self, dtype) -> list[Tensor]:
        """Start the all-reduce of the open bucket of `dtype` (asynchronously: the ops built after it,
        the rest of the backward pass, run while it travels); `finish` waits for it."""
        pending = self.open.pop(dtype, [])
        if not pending:
            return []
        g = self.graph
        flat = [g.reshape(grad, (-1,)) for _, grad in pending]
        packed = flat[0] if len(flat) == 1 else g.concat(flat, axis=0)
        started = g.all_reduce(packed, "mean", group=self.group, asynchronous=True)
        self.started.append((started, pending))
        return [started]

    def finish(self) -> None:
        """Wait for every bucket, in the order they started, and unpack the averaged gradients."""
        g = self.graph
        for started, pending in self.started:
            reduced = g.collective_wait(started)
            sizes = [int(np.prod(v.shape)) for v, _ in pending]
            parts = [reduced] if len(sizes) == 1 else g.split(reduced, sizes)
            for (variable, _), part in zip(pending, parts):
                self.averaged[variable.id] = g.reshape(part, variable.shape)
        self.started = []


def _nbytes(t: Tensor) -> int:
    if t.shape is None or any(d < 0 for d in t.shape):
        raise GraphError(f"data_parallel: gradient {t.name} has shape {t.type}; trained variables have static shapes")
    return int(np.prod(t.shape)) * t.dtype.itemsize


def synchronize_variables(graph, variables: Sequence[Tensor] | None = None, root: int = 0,
                          group: str = WORLD) -> None:
    """Give every process the values process `root` holds (all of the graph's variables by default),
    so that training starts from identical weights."""
    import torch.distributed as dist

    if group_size(group) == 1:
        return
    pg = process_group(group)
    source = root if pg is None else dist.get_global_rank(pg, root)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else None
    targets = variables if variables is not None else [op.outputs[0] for op in graph.operations
                                                     if op.op == "variable"]
    for v in targets:
        value = graph.variable_value(v).torch()
        buffer = value.to(device) if device is not None else value.clone()
        dist.broadcast(buffer, src=source, group=pg)
        graph.set_variable_value(v, buffer.to(value.device))


def shard(count: int, epoch: int = 0, seed: int = 0, group: str = WORLD, shuffle: bool = True) -> np.ndarray:
    """This process's indices into a dataset of `count` items for `epoch`.

    Every process draws the same permutation (from `seed` and `epoch`) and takes every
    world-size-th index from its rank on, so the parts are disjoint, equal in size (the last
    ``count % world_size`` items of the permutation are left out of the epoch, like
    DistributedSampler's ``drop_last``) and cover the dataset across epochs.
    """
    if count < 0:
        raise GraphError(f"shard: count must be >= 0, got {count}")
    size, r = group_size(group), group_rank(group)
    order = np.random.default_rng([seed, epoch]).permutation(count) if shuffle else np.arange(count)
    usable = count - count % size
    return order[:usable][r::size]


def save(graph, path: str | os.PathLike, group: str = WORLD) -> None:
    """`graph.save(path)` on rank 0 only, then a barrier, so that every process can read it afterwards."""
    if is_main(group):
        graph.save(path)
    barrier(group)


__all__ = ["init", "rank", "world_size", "is_main", "barrier", "data_parallel", "synchronize_variables", "shard",
           "save", "register_group", "DEFAULT_BUCKET_BYTES"]
