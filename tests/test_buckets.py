"""Shape buckets: one executable serves every size of a bucket, and a bucketed run returns exactly what the
unbucketed compiled run returns (kernels under TRITON_INTERPRET=1), for reductions over a padded axis,
softmax, layer normalization, means and matrix products over a padded contraction axis; results are also
held to a float64 PyTorch reference. Graphs that cannot be bucketed are compiled per shape, the log says why."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import stitchml as sm
from compiler_util import assert_reference, values
from tolerance import sensitivity
from stitchml.runtime.buckets import BucketedExecutable, bucket_size


def _exact(got: dict, want: dict, targets, what: str) -> None:
    for t in targets:
        a, b = got[t].torch(), want[t].torch()
        assert a.shape == b.shape and a.dtype == b.dtype, \
            f"{what}: {t.name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))), \
            f"{what}: {t.name}: bucketed differs from unbucketed by {(a.double() - b.double()).abs().max()}"


def test_bucket_rules_round_up():
    assert [bucket_size(n, "pow2") for n in (1, 2, 3, 33, 64, 65)] == [1, 2, 4, 64, 64, 128]
    assert [bucket_size(n, 16) for n in (1, 16, 17)] == [16, 16, 32]
    assert [bucket_size(n, (8, 100, 1000)) for n in (1, 8, 9, 1000, 1001)] == [8, 8, 100, 1000, None]
    assert bucket_size(0, "pow2") is None
    with pytest.raises(sm.FeedError, match="a rule must be"):
        bucket_size(3, "pow3")


def _stream(g, spec, targets, feeds_for, sizes, references, exact) -> None:
    """Run bucketed and unbucketed for each size: `exact` targets bit for bit, the others within the vendor
    GEMM's rounding; every target within the tolerance rule of its float64 reference."""
    for size in sizes:
        feeds = feeds_for(*size)
        got = g.run(feeds, targets, device="cpu", buckets=spec)
        want = g.run(feeds, targets, device="cpu", compiled=True)
        _exact(got, want, exact, f"size {size}")
        for t in targets:
            torch.testing.assert_close(got[t].torch(), want[t].torch(), rtol=2e-6, atol=1e-6)
        args = [f.double() for f in feeds.values()]
        scales = sensitivity(references, args)
        for t, ref, scale in zip(targets, references(*args), scales):
            assert_reference(got[t].torch(), ref, f"{t.name} at {size}", scale=scale)


def test_softmax_norms_and_reductions_over_padded_axes_equal_the_unbucketed_run_exactly():
    g = sm.Graph("rows")
    x = g.placeholder((-1, -1), sm.float32, name="x")  # batch, sequence
    gamma = g.placeholder((-1,), sm.float32, name="gamma")
    targets = [g.softmax(x * 0.5), g.log_softmax(x, 0), g.layer_normalization(x, gamma=gamma), g.variance(x, 0),
               g.reduction_mean(x), g.reduction_maximum(g.negative(x), 1, keep_dims=True)]
    rng = np.random.default_rng(0)
    _stream(g, {x: {0: "pow2", 1: 8}, gamma: {0: 8}}, targets,
            lambda b, s: {x: values(rng, (b, s), sm.float32), gamma: values(rng, (s,), sm.float32, 0.5, 1.5)},
            [(3, 5), (2, 1), (3, 7)],
            lambda xv, gv: [torch.softmax(xv * 0.5, -1), torch.log_softmax(xv, 0),
                            F.layer_norm(xv, (xv.shape[1],), gv), xv.var(0, unbiased=False), xv.mean(),
                            (-xv).amax(1, keepdim=True)],
            # a sum over all axes visits the elements in another order when the rows are padded
            [t for t in targets if t.op.op != "reduction_mean"])
    bucketed = [line for line in g.compile_log if "for a new bucket" in line]
    assert len(bucketed) == 2, g.compile_log  # (4, 8) served 3x5 and 3x7; (2, 8) served 2x1
    assert g.bucket_log[0] == "bucket x: float32[4, 8], gamma: float32[8] served x: [3, 5], gamma: [5]"
    assert g.bucket_log[-1].startswith("bucket x: float32[4, 8], gamma: float32[8] served x: [3, 7]")


def test_attention_with_padded_batch_and_sequence_matches_the_unbucketed_run():
    g = sm.Graph("attention")
    x = g.placeholder((-1, -1, 8), sm.float32, name="x")  # batch, sequence, features
    w = g.placeholder((8, 8), sm.float32, name="w")
    h = g.layer_normalization(x) @ w
    scores = g.softmax(h @ g.transpose(h, (0, 2, 1)) * 0.35)  # over the padded sequence axis
    mixed = scores @ h  # contracts the padded sequence axis
    targets = [mixed, g.reduction_mean(mixed, 1)]
    rng = np.random.default_rng(1)

    def reference(xv, wv):
        h64 = F.layer_norm(xv, (8,)) @ wv
        mix = torch.softmax(h64 @ h64.transpose(1, 2) * 0.35, -1) @ h64
        return [mix, mix.mean(1)]

    wv = values(rng, (8, 8), sm.float32, -0.5, 0.5)
    _stream(g, {x: {0: "pow2", 1: 8}}, targets, lambda b, s: {x: values(rng, (b, s, 8), sm.float32), w: wv},
            [(3, 5), (4, 8), (3, 7)], reference, [])
    assert sum("for a new bucket" in line for line in g.compile_log) == 1, g.compile_log


@pytest.mark.parametrize("dtype", [sm.int32, sm.bool, sm.float32])
def test_every_reduction_masks_with_its_neutral(dtype):
    g = sm.Graph(f"reductions-{dtype}")
    x = g.placeholder((3, -1), dtype, name="x")
    ops = ["reduction_sum", "reduction_maximum", "reduction_minimum", "reduction_product",
           "reduction_arg_maximum", "reduction_arg_minimum"]
    targets = [getattr(g, op)(x, -1) for op in ops]
    if dtype.is_floating:
        targets.append(g.reduction_mean(x, -1, keep_dims=True))
    rng = np.random.default_rng(1)
    for n in (1, 5, 9):  # buckets of 8 and 16; every real value negative or zero shows a wrong neutral
        xv = values(rng, (3, n), dtype, -3.0, 0.0) if not dtype.is_bool else values(rng, (3, n), dtype)
        got = g.run({x: xv}, targets, device="cpu", buckets={x: {1: 8}})
        _exact(got, g.run({x: xv}, targets, device="cpu", compiled=True), targets, f"{dtype} length {n}")
    assert g.compile_log[0].startswith(f"compiled 'reductions-{dtype}' for a new bucket"), g.compile_log


def test_compile_with_buckets_serves_its_bucket_and_refuses_other_sizes():
    g = sm.Graph("compiled")
    x = g.placeholder((-1, 4), sm.float32, name="x")
    y = g.softmax(x, 0)
    exe = g.compile({x: sm.TensorType((5, 4), sm.float32)}, [y], device="cpu", buckets={x: {0: "pow2"}})
    assert isinstance(exe, BucketedExecutable) and exe.kernel_count >= 1
    for n in (5, 7, 8):
        xv = torch.randn(n, 4)
        assert_reference(exe.run({x: xv})[y].torch(), torch.softmax(xv.double(), 0), f"{n} rows")
    with pytest.raises(sm.FeedError, match="do not fit bucket x: float32\\[8, 4\\]"):
        exe.run({x: torch.randn(9, 4)})


def test_the_graph_default_applies_and_a_refusal_falls_back_to_exact_shapes():
    g = sm.Graph("cumulative")
    x = g.placeholder((-1,), sm.float32, name="x")
    y = g.cumulative_sum(x, 0) * 2.0
    g.buckets = {x: {0: "pow2"}}
    for n in (3, 5):
        xv = torch.randn(n)
        torch.testing.assert_close(g.run({x: xv}, [y], device="cpu")[y].torch(), xv.cumsum(0) * 2.0)
    assert g.compile_log[0].startswith("no buckets for 'cumulative': cumulative_sum"), g.compile_log
    assert "padded" in g.compile_log[0] and sum("compiled" in line for line in g.compile_log) == 2
    with pytest.raises(sm.GraphError, match="cannot bucket graph 'cumulative': cumulative_sum"):
        g.compile({x: sm.TensorType((3,), sm.float32)}, [y], device="cpu")


def test_reshapes_that_merge_a_padded_axis_are_refused():
    g = sm.Graph("merge")
    x = g.placeholder((-1, 4), sm.float32, name="x")
    y = g.reduction_sum(g.reshape(x, (-1,)), 0)
    with pytest.raises(sm.GraphError, match="reshape .* merges or splits padded axis 0 of x"):
        g.compile({x: sm.TensorType((3, 4), sm.float32)}, [y], device="cpu", buckets={x: {0: 8}})


def test_bad_bucket_specs_are_feed_errors():
    g = sm.Graph()
    x = g.placeholder((-1, 4), sm.float32, name="x")
    for spec, match in [({x: {2: 8}}, "has rank 2, got axis 2"), ({"x": {0: 8}}, "keys must be placeholders"),
                        ({x: {0: 0}}, "a rule must be")]:
        with pytest.raises(sm.FeedError, match=match):
            g.run({x: torch.zeros(3, 4)}, [g.exponent(x)], device="cpu", buckets=spec)
