"""One process of a test in tests/test_distributed.py: ``python -m tests.distributed_worker SCENARIO OUT``.

The environment is what torchrun gives a process (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
each scenario writes what it measured to OUT (an .npz file) for the parent test to compare.
"""
from __future__ import annotations

import os
import sys
import traceback

import numpy as np
import torch

torch.set_num_threads(1)

import stitchml as sm  # noqa: E402


def _mlp(seed: int):
    rng = np.random.default_rng(seed)
    g = sm.Graph()
    x = g.placeholder((-1, 6), name="x")
    y = g.placeholder((-1,), sm.int64, name="y")
    w1 = g.variable(rng.standard_normal((6, 16)).astype(np.float32) * 0.5, name="w1")
    b1 = g.variable(np.zeros(16, np.float32), name="b1")
    w2 = g.variable(rng.standard_normal((16, 3)).astype(np.float32) * 0.5, name="w2")
    logits = g.relu(x @ w1 + b1) @ w2
    loss = g.softmax_cross_entropy(logits, y, reduction="mean")
    return g, x, y, [w1, b1, w2], loss


def _data(steps: int, batch: int):
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((steps, batch, 6)).astype(np.float32)
    ys = rng.integers(0, 3, (steps, batch)).astype(np.int64)
    return xs, ys


def collectives(rank: int, size: int, out: str) -> None:
    import torch.distributed as dist

    rng = np.random.default_rng(100 + rank)
    a = rng.standard_normal((4, 6)).astype(np.float32)
    g = sm.Graph()
    x = g.placeholder((4, 6), name="x")
    results = {"sum": g.all_reduce(x), "mean": g.all_reduce(x, "mean"), "max": g.all_reduce(x, "max"),
               "min": g.all_reduce(x, "min"), "gather0": g.all_gather(x), "gather1": g.all_gather(x, axis=1),
               "scatter0": g.reduce_scatter(x), "scatter1": g.reduce_scatter(x, "mean", axis=1),
               "bcast": g.broadcast(x, root=1), "root": g.reduce_to_root(x, root=1)}
    targets = list(results.values())
    eager = g.run({x: a}, targets, device="cpu", compiled=False)
    exe = g.compile({x: sm.TensorType((4, 6), sm.float32)}, targets)
    compiled = exe.run({x: a})
    # torch.distributed's own answers
    t = torch.from_numpy(a)
    want = {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
        r = t.clone()
        dist.all_reduce(r, op=op)
        want[name] = r
    want["mean"] = want["sum"] / size
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t)
    want["gather0"], want["gather1"] = torch.cat(parts, 0), torch.cat(parts, 1)
    want["scatter0"] = want["sum"].chunk(size, 0)[rank]
    want["scatter1"] = want["mean"].chunk(size, 1)[rank]
    b = t.clone()
    dist.broadcast(b, src=1)
    want["bcast"] = b
    want["root"] = want["sum"] if rank == 1 else torch.zeros_like(t)
    arrays = {}
    for name, tensor in results.items():
        arrays[f"eager_{name}"] = eager[tensor].numpy()
        arrays[f"compiled_{name}"] = compiled[tensor].numpy()
        arrays[f"want_{name}"] = want[name].numpy()
    np.savez(out, **arrays)


def gradients(rank: int, size: int, out: str) -> None:
    """d(sum over ranks of loss_r)/dx_r for collectives, against the same derivative written out by hand."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((size, 2, 4))  # every rank's input, known to all for the reference
    ws = rng.standard_normal((size, 2 * size, 4))  # loss_r = sum(w_r * all_gather(x_r))
    vs = rng.standard_normal((size, 2, 4))  # loss_r = sum(v_r * all_reduce(x_r)) and broadcast
    g = sm.Graph()
    x = g.placeholder((2, 4), sm.float64, name="x")
    gathered = g.reduction_sum(g.constant(ws[rank]) * g.all_gather(x))
    reduced = g.reduction_sum(g.constant(vs[rank]) * g.all_reduce(x))
    cast = g.reduction_sum(g.constant(vs[rank]) * g.broadcast(x, root=0))
    scattered = g.reduction_sum(g.constant(vs[rank][:, : 4 // size]) * g.reduce_scatter(x, axis=1)) \
        if 4 % size == 0 else None
    grads = [g.gradients(loss, [x])[x] for loss in (gathered, reduced, cast, scattered)]
    got = g.run({x: xs[rank]}, grads, device="cpu")
    want_gather = sum(ws[r] for r in range(size))[2 * rank: 2 * rank + 2]
    want_reduce = sum(vs[r] for r in range(size))
    want_cast = want_reduce if rank == 0 else np.zeros_like(want_reduce)
    want_scatter = np.concatenate([vs[r][:, : 4 // size] for r in range(size)], axis=1)
    np.savez(out, gather=got[grads[0]].numpy(), want_gather=want_gather, reduce=got[grads[1]].numpy(),
             want_reduce=want_reduce, cast=got[grads[2]].numpy(), want_cast=want_cast,
             scatter=got[grads[3]].numpy(), want_scatter=want_scatter)


def train(rank: int, size: int, out: str, steps: int = 5, batch: int = 8) -> None:
    """A data-parallel SGD step on this rank's slice of each batch; weights after `steps` steps."""
    g, x, y, params, loss = _mlp(seed=rank)  # different initial values per rank: synchronize_variables fixes that
    sm.distributed.synchronize_variables(g)
    updates = sm.optim.SGD(0.5, momentum=0.9).minimize(g, loss, params, data_parallel="world", bucket_bytes=256)
    xs, ys = _data(steps, batch * size)
    exe = g.compile({x: sm.TensorType((batch, 6), sm.float32), y: sm.TensorType((batch,), sm.int64)}, [loss], updates)
    losses = []
    for s in range(steps):
        part = slice(rank * batch, (rank + 1) * batch)
        losses.append(exe.run({x: xs[s, part], y: ys[s, part]})[loss].item())
    path = os.path.join(os.path.dirname(out), "checkpoint.smg")
    sm.distributed.save(g, path)
    loaded = sm.Graph.load(path)
    values = {p.name: g.variable_value(p).numpy() for p in params}
    np.savez(out, **values, **{f"loaded_{k}": loaded.variable_value(
        next(op.outputs[0] for op in loaded.operations if op.op == "variable" and op.outputs[0].name == k)).numpy()
        for k in values}, reduces=np.array(sum(op.op == "all_reduce" for op in g.operations)), losses=np.array(losses))


def dies(rank: int, size: int, out: str) -> None:
    """Rank 1 exits before the collective; the others must get a typed error within the timeout."""
    if rank == 1:
        os._exit(0)
    g = sm.Graph()
    x = g.placeholder((3,), name="x")
    y = g.all_reduce(x)
    try:
        g.run({x: np.ones(3, np.float32)}, [y], device="cpu")
    except sm.ExecutionError as e:
        np.savez(out, error=np.array(str(e)))
        return
    np.savez(out, error=np.array(""))


def everything(rank: int, size: int, out: str) -> None:
    """The three scenarios that succeed, in one process start (each writes OUT with its name)."""
    for name in ("collectives", "gradients", "train"):
        SCENARIOS[name](rank, size, out.replace("everything", name))


SCENARIOS = {"collectives": collectives, "gradients": gradients, "train": train, "dies": dies,
             "everything": everything}


def main() -> int:
    scenario, out = sys.argv[1], sys.argv[2]
    timeout = float(os.environ.get("STITCHML_TEST_TIMEOUT", "60"))
    rank, size = sm.distributed.init("gloo", timeout_s=timeout)
    try:
        SCENARIOS[scenario](rank, size, out)
    except Exception:  # noqa: BLE001  (the parent reads the traceback)
        traceback.print_exc()
        return 1
    if scenario != "dies":
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
