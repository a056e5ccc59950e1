"""Collectives and data-parallel training across processes (gloo on the CPU), as torchrun runs them.

Each test starts N processes of tests/distributed_worker.py with torchrun's environment and compares
what they wrote with torch.distributed's own results, hand-written derivatives, or a single-process
run on the whole batch.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import stitchml as sm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, tmp_path, size: int = 2, timeout: float = 60.0, worker_timeout: float = 60.0):
    port = _port()
    procs, outs = [], []
    for rank in range(size):
        out = str(tmp_path / f"{scenario}{rank}.npz")
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "STITCHML_TEST_TIMEOUT": str(worker_timeout), "PYTHONPATH": ROOT}
        env.pop("TRITON_INTERPRET", None)  # the CPU path runs stitched kernels through their reference ops
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.distributed_worker", scenario, out], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs.append(out)
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{scenario}: a process hung past {timeout} s")
    return procs, outs, logs


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One start of two processes for the scenarios that succeed (starting Python and torch dominates)."""
    tmp = tmp_path_factory.mktemp("distributed")
    procs, outs, logs = launch("everything", tmp)
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log
    return lambda name: [np.load(o.replace("everything", name)) for o in outs]


def test_collectives_match_torch_distributed_eager_and_compiled(ran):
    results = ran("collectives")
    for rank, r in enumerate(results):
        for name in ("sum", "mean", "max", "min", "gather0", "gather1", "scatter0", "scatter1", "bcast", "root"):
            np.testing.assert_allclose(r[f"eager_{name}"], r[f"want_{name}"], rtol=1e-6, err_msg=f"{name} rank {rank}")
            np.testing.assert_allclose(r[f"compiled_{name}"], r[f"want_{name}"], rtol=1e-6,
                                       err_msg=f"compiled {name} rank {rank}")
    # the ranks really held different values: the collectives combined something
    assert not np.array_equal(results[0]["want_gather0"][:4], results[0]["want_gather0"][4:])


def test_gradients_of_collectives_are_their_transposes(ran):
    for rank, r in enumerate(ran("gradients")):
        for name in ("gather", "reduce", "cast", "scatter"):
            np.testing.assert_allclose(r[name], r[f"want_{name}"], rtol=1e-12, atol=1e-12, err_msg=f"{name} {rank}")


def _single_process_weights(steps: int = 5, batch: int = 8, size: int = 2):
    """The same training on one process with the whole batch (rank 0's initial weights)."""
    sys.path.insert(0, ROOT)
    from tests.distributed_worker import _data, _mlp

    g, x, y, params, loss = _mlp(seed=0)
    updates = sm.optim.SGD(0.5, momentum=0.9).minimize(g, loss, params)
    xs, ys = _data(steps, batch * size)
    for s in range(steps):
        g.run({x: xs[s], y: ys[s]}, [loss], updates, device="cpu")
    return {p.name: g.variable_value(p).numpy() for p in params}


def test_data_parallel_training_equals_one_process_on_the_whole_batch(ran):
    results = ran("train")
    want = _single_process_weights()
    for rank, r in enumerate(results):
        for name, value in want.items():
            np.testing.assert_allclose(r[name], value, rtol=2e-5, atol=2e-6, err_msg=f"{name} on rank {rank}")
            np.testing.assert_array_equal(r[name], results[0][name])  # identical on every rank
            np.testing.assert_array_equal(r[f"loaded_{name}"], r[name])  # the checkpoint rank 0 wrote
        assert int(r["reduces"]) >= 2  # 256-byte buckets: several all-reduces, not one at the end
    assert not np.array_equal(results[0]["losses"], results[1]["losses"])  # the ranks trained on different data


def test_a_rank_that_dies_gives_the_others_a_typed_error_not_a_hang(tmp_path):
    procs, outs, logs = launch("dies", tmp_path, timeout=90, worker_timeout=5)
    assert procs[0].returncode == 0, logs[0]
    error = str(np.load(outs[0])["error"])
    assert error.startswith("all_reduce") and "failed on inputs" in error, error


def test_buckets_start_during_the_backward_pass_and_are_waited_for_after_it():
    """Each bucket's all-reduce starts in program order right after its last gradient, and is waited for
    after the backward pass: the ops between the two (earlier layers' gradients) overlap its travel."""
    g = sm.Graph()
    x = g.placeholder((4, 8), name="x")
    rng = np.random.default_rng(3)
    ws = [g.variable(rng.standard_normal((8, 8)).astype(np.float32) * 0.4, name=f"w{i}") for i in range(3)]
    h = x
    for w in ws:
        h = g.tanh(h @ w)
    loss = g.reduction_sum(h)
    grads = sm.distributed.data_parallel(g, loss, ws, bucket_bytes=8 * 8 * 4)
    ops = [op.op for op in g.operations]
    starts = [i for i, op in enumerate(ops) if op == "all_reduce"]
    waits = [i for i, op in enumerate(ops) if op == "collective_wait"]
    assert len(starts) == len(waits) == 3
    assert all(g.operations[i].attrs["asynchronous"] for i in starts)
    # the last layer's bucket starts before the gradients of the earlier layers are computed ...
    assert ops[starts[0]:starts[-1]].count("matrix_multiplication") >= 2
    # ... and nothing waits until the backward pass is done
    assert max(starts) < min(waits)
    # in one process the averaged gradient is the gradient, eager and compiled
    want = g.gradients(loss, ws)
    feeds = {x: rng.standard_normal((4, 8)).astype(np.float32)}
    got = g.run(feeds, [*grads.values(), *want.values()], device="cpu")
    exe = g.compile({x: sm.TensorType((4, 8), sm.float32)}, list(grads.values()))
    compiled = exe.run(feeds)
    for w in ws:
        np.testing.assert_array_equal(got[grads[w]].numpy(), got[want[w]].numpy())  # the same ops, eagerly
        np.testing.assert_allclose(compiled[grads[w]].numpy(), got[want[w]].numpy(), rtol=1e-5, atol=1e-6)


def test_shard_splits_each_epoch_into_equal_disjoint_parts(monkeypatch):
    import stitchml.distributed as d

    parts = []
    for r in range(3):
        monkeypatch.setattr(d, "group_size", lambda group="world": 3)
        monkeypatch.setattr(d, "group_rank", lambda group="world", r=r: r)
        parts.append(d.shard(10, epoch=1, seed=5))
    assert [len(p) for p in parts] == [3, 3, 3]
    assert len(set(np.concatenate(parts))) == 9
    assert not np.array_equal(d.shard(10, epoch=1, seed=5), d.shard(10, epoch=2, seed=5))


def test_bad_arguments_are_typed_errors():
    g = sm.Graph()
    w = g.variable(np.ones(3, np.float32))
    with pytest.raises(sm.GraphError, match="bucket_bytes must be a positive int"):
        sm.distributed.data_parallel(g, g.reduction_sum(w), [w], bucket_bytes=0)
    with pytest.raises(sm.ShapeError, match="process group 'other' is not registered"):
        g.all_reduce(w, group="other")
    with pytest.raises(sm.GraphError, match="must be a non-empty string"):
        sm.distributed.register_group("world", None)
