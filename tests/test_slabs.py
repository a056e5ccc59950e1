"""A matrix product and its epilogue in slabs (passes/slabs.py, runtime/slabs.py), forced on small shapes with
compile option `epilogue_slabs`: uneven last slabs, a bias, batch axes (broadcast ones too), transposed
operands and epilogue inputs, in place and overlapped. Every result is held to the float64 reference and to
the op-by-op run, and the step must really run in the number of slabs the plan gives."""
from __future__ import annotations

import importlib

import pytest
import torch

import stitchml as sm
from compiler_util import Case, check_case
from stitchml.runtime.slabs import Slab, Slabs, SlabView

pytestmark = pytest.mark.usefixtures("triton_interpreter")
slabs = importlib.import_module("stitchml.passes.slabs")

F = torch.nn.functional


def _slabs_run(exe) -> Slabs:
    (step,) = [s for s in exe.steps if s.kind == "matmul"]
    run = step.run.fn  # under the TF32 wrapper
    assert isinstance(run, Slabs), f"the product did not run in slabs: {type(run).__name__}"
    return run


# (case, bytes per slab, slabs expected); float32 feeds: 4 bytes an element
CASES = [
    # 37 rows of 24 in slabs of 10 rows: 10, 10, 10, 7
    (Case("slabs_bias_gelu",
          lambda g, feed: [g.gelu(feed((37, 16)) @ feed((16, 24)) + feed((24,)))],
          lambda x, w, b: [F.gelu(x @ w + b)]), 10 * 24 * 4, 4),
    # a transposed left operand and a transposed full-size epilogue input (strided views, no copies)
    (Case("slabs_transposed",
          lambda g, feed: [g.tanh(g.transpose(feed((16, 29)), [1, 0]) @ feed((16, 12))) *
                           g.transpose(feed((12, 29)), [1, 0])],
          lambda x, w, r: [torch.tanh(x.T @ w) * r.T]), 8 * 12 * 4, 4),
    # a batch against a shared weight; slabs of rows within each matrix (3 matrices x 2 slabs)
    (Case("slabs_batched_rows",
          lambda g, feed: [g.relu(feed((3, 21, 16)) @ feed((16, 20)) + feed((21, 20)))],
          lambda x, w, r: [torch.relu(x @ w + r)]), 11 * 20 * 4, 6),
    # batch axes broadcast on both sides: whole matrices per slab, 2 of the 5, the last slab one
    (Case("slabs_batched_matrices",
          lambda g, feed: [g.sigmoid(feed((5, 1, 6, 8)) @ feed((1, 2, 8, 7)) - feed((7,)))],
          lambda x, w, b: [torch.sigmoid(x @ w - b)]), 2 * 2 * 6 * 7 * 4, 3),
    # bfloat16: the epilogue computes in float32 and rounds once
    (Case("slabs_bfloat16",
          lambda g, feed: [g.gelu(feed((33, 16), sm.bfloat16) @ feed((16, 40), sm.bfloat16) +
                                  feed((40,), sm.bfloat16))],
          lambda x, w, b: [F.gelu(x @ w + b)]), 16 * 40 * 2, 3),
]


@pytest.mark.parametrize("mode", [{}, {"epilogue_in_place": True}, {"epilogue_overlap": True}],
                         ids=["separate", "in_place", "overlap"])
@pytest.mark.parametrize("case,nbytes,count", CASES, ids=[c[0].name for c in CASES])
def test_slabbed_product_matches_the_reference(case, nbytes, count, mode):
    out = check_case(case, {"epilogue_slabs": nbytes, **mode})
    run = _slabs_run(out.exe)
    assert len(run.slabs) == count
    assert run.in_place == bool(mode.get("epilogue_in_place"))
    again = out.exe.run(out.feeds)[out.targets[0]].torch()  # a second run binds the slabs' views afresh
    assert torch.equal(again, out.compiled[0])


def test_one_slab_runs_only_in_place():
    case = CASES[0][0]
    whole = 37 * 24 * 4
    out = check_case(case, {"epilogue_slabs": whole, "epilogue_in_place": True})
    assert len(_slabs_run(out.exe).slabs) == 1
    out = check_case(case, {"epilogue_slabs": whole})  # one slab, not in place: the whole-product path
    (step,) = [s for s in out.exe.steps if s.kind == "matmul"]
    assert type(step.run).__name__ == "Chain"


def test_slabs_are_off_by_default():
    g = sm.Graph("default")
    x, w = g.placeholder((37, 16), sm.float32), g.placeholder((16, 24), sm.float32)
    y = g.relu(x @ w)
    exe = g.compile({x: sm.TensorType((37, 16), sm.float32), w: sm.TensorType((16, 24), sm.float32)}, [y])
    (step,) = [s for s in exe.steps if s.kind == "matmul"]
    assert type(step.run).__name__ == "Chain"


@pytest.mark.parametrize("shape,itemsize,budget,want", [
    ((8192, 8192), 2, 32 << 20, (0, 2048)),  # the rows of a 2-D product
    ((4, 8192, 8192), 2, 32 << 20, (1, 2048)),  # rows of each matrix of a batch
    ((1000, 64, 64), 4, 1 << 20, (0, 64)),  # whole matrices of a batch
    ((3, 5), 4, 4, (0, 1)),  # a row larger than the budget: one row a slab
    ((7, 5), 4, 1 << 20, (0, 7)),  # everything fits: one slab
])
def test_slab_axis(shape, itemsize, budget, want):
    assert slabs.slab_axis(shape, itemsize, budget) == want


def _views_of(n: int) -> Slabs:
    """A one-slab run over slots a=0, b=1, epilogue input 2, output 3 (views bound at 4 and 5)."""
    views = (SlabView(4, 3, (n,), (1,), 0), SlabView(5, 3, (n,), (1,), 0))
    slab = Slab((), (), views, lambda env: None)
    return Slabs(lambda out, a, b: out, {}, 0, 1, [slab], [3], [2], whole=lambda env: env.append("whole"),
                 in_place=True, overlap=False)


def test_buffers_that_share_memory_run_the_whole_product():
    buf = torch.zeros(64)
    run = _views_of(8)
    assert run.safe([buf[:8], buf[8:16], buf[16:24], buf[24:32], None, None])
    assert not run.safe([buf[:8], buf[8:16], buf[16:24], buf[4:12], None, None])  # the output overlaps `a`
    assert not run.safe([buf[:8], buf[8:16], buf[16:24], buf[16:24], None, None])  # in place: an epilogue input
    run.in_place = False
    assert run.safe([buf[:8], buf[8:16], buf[16:24], buf[16:24], None, None])  # read at the index it writes
    env = [buf[:8], buf[8:16], buf[16:24], buf[0:8], None, None]
    run(env)
    assert env[-1] == "whole"
