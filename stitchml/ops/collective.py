"""Collective primitives: all_reduce, all_gather, reduce_scatter, broadcast and reduce_to_root.

Every process of a group builds the same graph (SPMD) and runs it; a
collective op combines the values the processes hold for one tensor. They run
through `torch.distributed` (NCCL on GPUs, gloo on CPUs) over a process group
named by the op's `group` attribute: ``"world"`` (the default group that
``torch.distributed.init_process_group`` or ``torchrun`` made) or a name given
to `stitchml.distributed.register_group`. The group's size is read when the op
is built and stored in the IR, so shape rules are static; a run in a group of
another size is an ExecutionError. Without an initialised process group every
op runs as in a group of one (all_reduce is the identity), so a graph with
collectives still runs, compiles and tests in a single process.

Gradients follow the sum of the ranks' losses (the data-parallel convention):
all_reduce(sum)'s is all_reduce(sum), all_gather's is reduce_scatter(sum) and
back, broadcast's is reduce_to_root(sum) and back.

They are opaque to the compiler: each runs between kernels on the run's
stream, and takes a run context so that constant folding leaves them alone.
"""
from __future__ import annotations

import threading

import torch

from ..errors import ExecutionError, GraphError, ShapeError
from ..ir import UNKNOWN, Tensor, TensorType
from ..registry import OPAQUE, Primitive, builder, register

REDUCTIONS = ("sum", "mean", "max", "min")
WORLD = "world"

_groups: dict[str, object] = {}
_groups_lock = threading.Lock()


def register_group(name: str, group) -> None:
    """Make a torch.distributed process group usable as ``group=name`` in collective ops."""
    if not isinstance(name, str) or not name or name == WORLD:
        raise GraphError(f"a process group's name must be a non-empty string other than {WORLD!r}, got {name!r}")
    with _groups_lock:
        _groups[name] = group


def _dist():
    """torch.distributed when a process group is initialised, else None (a group of one)."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def process_group(name: str):
    """The torch.distributed group of `name` (None: the default group)."""
    if name == WORLD:
        return None
    with _groups_lock:
        if name not in _groups:
            raise GraphError(f"process group {name!r} is not registered; "
                             f"call stitchml.distributed.register_group({name!r}, group) first")
        return _groups[name]


def group_size(name: str) -> int:
    """The number of processes in group `name` now (1 without torch.distributed)."""
    dist = _dist()
    if dist is None:
        if name != WORLD:
            process_group(name)  # an unknown name is an error even in a single process
        return 1
    return dist.get_world_size(process_group(name))


def group_rank(name: str) -> int:
    """This process's rank in group `name` (0 without torch.distributed)."""
    dist = _dist()
    return 0 if dist is None else dist.get_rank(process_group(name))


def _live(group: str, world_size: int):
    """The group to issue on, after checking it has the size the graph was built for."""
    dist = _dist()
    size = 1 if dist is None else dist.get_world_size(process_group(group))
    if size != world_size:
        raise ExecutionError(f"process group {group!r} has {size} processes; the graph was built for {world_size}")
    return (dist, process_group(group)) if size > 1 else (None, None)


def _reduce_op(dist, reduce: str):
    return {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN}[reduce]


def _check_reduce(reduce: str, allowed=REDUCTIONS) -> None:
    if reduce not in allowed:
        raise ShapeError(f"reduce must be one of {allowed}, got {reduce!r}")


def _axis(shape, axis: int) -> int:
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"axis {axis} is out of range for rank {len(shape)}")
    return axis % len(shape)


# -- all_reduce ------------------------------------------------------------------------------------------
all_reduce = register(Primitive("all_reduce", OPAQUE, needs_context=True,
                                doc="Every process gets the sum / mean / max / min over the group of its input."))


@all_reduce.def_infer
def _all_reduce_infer(types, reduce, group, world_size, asynchronous=False):
    _check_reduce(reduce)
    if asynchronous and reduce not in ("sum", "mean"):
        raise ShapeError(f"asynchronous all_reduce supports reduce='sum' and 'mean', got {reduce!r}")
    if reduce == "mean" and not types[0].dtype.is_floating:
        raise ShapeError(f"reduce='mean' needs a floating-point input, got {types[0].dtype}")
    return types[0]


@all_reduce.def_impl(needs_context=True)
def _all_reduce_impl(ctx, x, reduce, group, world_size, asynchronous=False):
    dist, pg = _live(group, world_size)
    out = x.clone(memory_format=torch.contiguous_format)
    if dist is None:
        return out
    if reduce == "mean":  # gloo has no average: divide first, so the sum is the mean (and no pass after)
        out /= world_size
    work = dist.all_reduce(out, op=_reduce_op(dist, reduce), group=pg, async_op=asynchronous)
    if asynchronous:
        with _pending_lock:
            _pending[out.data_ptr()] = work
    return out


# Work handles of asynchronous all-reduces, by the address of the buffer they reduce into.
_pending: dict[int, object] = {}
_pending_lock = threading.Lock()


@all_reduce.def_vjp
def _all_reduce_vjp(g, op, dy):
    reduce, group = op.attrs["reduce"], op.attrs["group"]
    if reduce in ("sum", "mean"):
        return [g.all_reduce(dy, reduce, group=group)]
    # max / min: the sum of the ranks' cotangents flows to the inputs that were the extreme (ties share it).
    x, y = op.inputs[0], op.outputs[0]
    return [g.all_reduce(dy, "sum", group=group) * g.cast(g.equal(x, y), dy.dtype)]


@builder("all_reduce")
def _all_reduce(g, x, reduce: str = "sum", group: str = WORLD, asynchronous: bool = False, name=None) -> Tensor:
    """The sum (or "mean", "max", "min") of `x` over the processes of `group`, on every process.

    `asynchronous=True` issues it and goes on: the result must go through `collective_wait`, and
    nothing else may read it (the builder of every other op refuses it), so that the ops between
    the two overlap the communication.

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((2,), name="x")
    >>> y = g.all_reduce(x)  # in a single process, a group of one: the identity
    >>> g.run(feeds={x: np.array([1.0, 2.0], np.float32)}, targets=[y], device="cpu")[y].numpy().tolist()
    [1.0, 2.0]
    """
    x = g.as_tensor(x)
    attrs = {"reduce": reduce, "group": group, "world_size": _size(g, "all_reduce", group)}
    if asynchronous:
        attrs["asynchronous"] = True
    return g._emit1("all_reduce", [x], attrs, name)


collective_wait = register(Primitive(
    "collective_wait", OPAQUE, needs_context=True,
    doc="The result of an asynchronous all_reduce, once it has arrived (work.wait())."))


@collective_wait.def_infer
def _collective_wait_infer(types):
    return types[0]


@collective_wait.def_impl(needs_context=True)
def _collective_wait_impl(ctx, x):
    with _pending_lock:
        work = _pending.pop(x.data_ptr(), None)
    if work is not None:
        work.wait()
    return x


@collective_wait.def_vjp
def _collective_wait_vjp(g, op, dy):
    return [dy]


@builder("collective_wait")
def _collective_wait(g, x, name=None) -> Tensor:
    """Wait for the asynchronous all_reduce that produced `x`; its value, ready to read."""
    x = g.as_tensor(x)
    if x.op.op != "all_reduce" or not x.op.attrs.get("asynchronous"):
        raise g._error("collective_wait", f"expects the result of all_reduce(..., asynchronous=True), got the "
                                          f"result of {x.op.op}", [x])
    return g._emit1("collective_wait", [x], {}, name)


def _size(g, op: str, group) -> int:
    if not isinstance(group, str):
        raise g._error(op, f"group must be a process group's name, got {group!r}")
    try:
        return group_size(group)
    except GraphError as e:
        raise g._error(op, str(e)) from None


# -- all_gather / reduce_scatter ---------------------------------------------------------------------------
all_gather = register(Primitive("all_gather", OPAQUE, needs_context=True,
                                doc="The inputs of the group's processes concatenated along `axis`, in rank order."))


@all_gather.def_infer
def _all_gather_infer(types, axis, group, world_size):
    shape = types[0].shape
    if shape is None:
        return TensorType(None, types[0].dtype)
    a = _axis(shape, axis)
    d = shape[a]
    return TensorType(shape[:a] + (UNKNOWN if d == UNKNOWN else d * world_size,) + shape[a + 1:], types[0].dtype)


@all_gather.def_impl(needs_context=True)
def _all_gather_impl(ctx, x, axis, group, world_size):
    dist, pg = _live(group, world_size)
    x = x.contiguous()
    if dist is None:
        return x.clone()
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x, group=pg)
    return torch.cat(parts, dim=axis)


@all_gather.def_vjp
def _all_gather_vjp(g, op, dy):
    return [g.reduce_scatter(dy, "sum", axis=op.attrs["axis"], group=op.attrs["group"])]


reduce_scatter = register(Primitive(
    "reduce_scatter", OPAQUE, needs_context=True,
    doc="The sum (or mean, max, min) over the group, split along `axis`: process r keeps the r-th part."))


@reduce_scatter.def_infer
def _reduce_scatter_infer(types, reduce, axis, group, world_size):
    _check_reduce(reduce)
    if reduce == "mean" and not types[0].dtype.is_floating:
        raise ShapeError(f"reduce='mean' needs a floating-point input, got {types[0].dtype}")
    shape = types[0].shape
    if shape is None:
        return TensorType(None, types[0].dtype)
    a = _axis(shape, axis)
    d = shape[a]
    if d != UNKNOWN and d % world_size:
        raise ShapeError(f"axis {axis} has extent {d}, which does not split into {world_size} equal parts")
    return TensorType(shape[:a] + (UNKNOWN if d == UNKNOWN else d // world_size,) + shape[a + 1:], types[0].dtype)


@reduce_scatter.def_impl(needs_context=True)
def _reduce_scatter_impl(ctx, x, reduce, axis, group, world_size):
    dist, pg = _live(group, world_size)
    if x.shape[axis] % world_size:
        raise ValueError(f"axis {axis} has extent {x.shape[axis]}, which does not split into {world_size} parts")
    if dist is None:
        return x.clone(memory_format=torch.contiguous_format)
    total = x.clone(memory_format=torch.contiguous_format)
    # gloo has no reduce_scatter: reduce everywhere and keep this rank's part (NCCL's is the same result).
    if x.is_cuda:
        parts = [p.contiguous() for p in total.chunk(world_size, dim=axis)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, op=_reduce_op(dist, reduce), group=pg)
    else:
        dist.all_reduce(total, op=_reduce_op(dist, reduce), group=pg)
        out = total.chunk(world_size, dim=axis)[dist.get_rank(pg)].contiguous()
    return out / world_size if reduce == "mean" else out


@reduce_scatter.def_vjp
def _reduce_scatter_vjp(g, op, dy):
    reduce, axis, group = op.attrs["reduce"], op.attrs["axis"], op.attrs["group"]
    gathered = g.all_gather(dy, axis=axis, group=group)
    if reduce == "sum":
        return [gathered]
    if reduce == "mean":
        return [gathered / float(op.attrs["world_size"])]
    x, y = op.inputs[0], g.all_gather(op.outputs[0], axis=axis, group=group)
    return [gathered * g.cast(g.equal(x, y), dy.dtype)]


@builder("all_gather")
def _all_gather(g, x, axis: int = 0, group: str = WORLD, name=None) -> Tensor:
    """The `x` of every process of `group`, concatenated along `axis` in rank order."""
    x = g.as_tensor(x)
    return g._emit1("all_gather", [x], {"axis": int(axis), "group": group,
                                        "world_size": _size(g, "all_gather", group)}, name)


@builder("reduce_scatter")
def _reduce_scatter(g, x, reduce: str = "sum", axis: int = 0, group: str = WORLD, name=None) -> Tensor:
    """all_reduce(x) split into the group's size along `axis`; process r gets part r."""
    x = g.as_tensor(x)
    return g._emit1("reduce_scatter", [x], {"reduce": reduce, "axis": int(axis), "group": group,
                                            "world_size": _size(g, "reduce_scatter", group)}, name)


# -- broadcast / reduce_to_root ------------------------------------------------------------------------------
def _rooted_infer(types, root, group, world_size, reduce="sum"):
    _check_reduce(reduce, ("sum",))
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < world_size:
        raise ShapeError(f"root must be a rank in [0, {world_size}), got {root!r}")
    return types[0]


broadcast = register(Primitive("broadcast", OPAQUE, needs_context=True, infer=_rooted_infer,
                               doc="Every process gets the input of process `root`."))
reduce_to_root = register(Primitive(
    "reduce_to_root", OPAQUE, needs_context=True, infer=_rooted_infer,
    doc="Process `root` gets the sum over the group; the others get zeros (broadcast's gradient)."))


@broadcast.def_impl(needs_context=True)
def _broadcast_impl(ctx, x, root, group, world_size):
    dist, pg = _live(group, world_size)
    out = x.clone(memory_format=torch.contiguous_format)
    if dist is not None:
        dist.broadcast(out, src=_global(dist, pg, root), group=pg)
    return out


@reduce_to_root.def_impl(needs_context=True)
def _reduce_to_root_impl(ctx, x, root, group, world_size, reduce="sum"):
    dist, pg = _live(group, world_size)
    out = x.clone(memory_format=torch.contiguous_format)
    if dist is not None:
        dist.reduce(out, dst=_global(dist, pg, root), op=dist.ReduceOp.SUM, group=pg)
        if dist.get_rank(pg) != root:
            out.zero_()  # torch leaves non-root buffers unspecified
    return out


def _global(dist, pg, rank: int) -> int:
    return rank if pg is None else dist.get_global_rank(pg, rank)


@broadcast.def_vjp
def _broadcast_vjp(g, op, dy):
    return [g.reduce_to_root(dy, root=op.attrs["root"], group=op.attrs["group"])]


@reduce_to_root.def_vjp
def _reduce_to_root_vjp(g, op, dy):
    return [g.broadcast(dy, root=op.attrs["root"], group=op.attrs["group"])]


@builder("broadcast")
def _broadcast(g, x, root: int = 0, group: str = WORLD, name=None) -> Tensor:
    """The `x` of process `root` of `group`, on every process (variables start equal this way)."""
    x = g.as_tensor(x)
    return g._emit1("broadcast", [x], {"root": root, "group": group, "world_size": _size(g, "broadcast", group)},
                    name)


@builder("reduce_to_root")
def _reduce_to_root(g, x, root: int = 0, group: str = WORLD, name=None) -> Tensor:
    """The sum of `x` over `group` on process `root`, zeros on the others."""
    x = g.as_tensor(x)
    return g._emit1("reduce_to_root", [x], {"root": root, "group": group, "reduce": "sum",
                                            "world_size": _size(g, "reduce_to_root", group)}, name)
