"""The one tolerance rule of the test suite (docs/semantics.md, "Numerics and tolerances").

Every floating result is compared with a reference computed in float64 from the same, already
rounded, inputs; never with another float32 computation, whose last bits depend on the CPU's math
library (AMD and Intel builds of torch differ by an ulp in exp, pow...). An element passes when it
equals the reference (NaN where it is NaN, infinities alike), equals the reference rounded to the
result's type, or lies within

    eps(dtype) * |ref|                                  the one rounding of the result to its type
    + k(family) * eps(work) * (|ref| + sqrt(n) * cond)  the computation, in its working precision
                                                          (composites and graphs: cond + reach)
    + eps(dtype) * tiny(dtype)                          one subnormal step near zero

* eps(t): machine epsilon of t (2**-10 float16, 2**-7 bfloat16, 2**-23 float32, 2**-52 float64).
* work: the precision the computation runs in. Ops and composites compute half types in float32 and
  round once, so work is float32 for them; a graph of several primitives rounds after each in its
  own type, so work is the result's type there (family "graph").
* cond = sum_i |d ref / d x_i| * |x_i|, from float64 autograd on the reference: how much the result
  moves when every input (and so every term a sum or a product accumulates) is off by one relative
  unit. It is |x f'(x)| for a function of one value (10**x computed as exp2(x log2 10) loses
  |x ln 10| units), sum |x_i| for a sum, |A| |B| for a matrix product, |x| / sigma for a
  normalization of data far from zero.
* n: the number of inputs the element depends on (nonzero partial derivatives); rounding errors of
  a sum of n terms grow like sqrt(n) (blocked and pairwise sums, as every backend uses).
* reach: the largest |x_i| the element depends on, for composites and graphs only. Their formulas
  add intermediate terms of the inputs' size that cancel (1 + erf(x / sqrt 2) in GeLU, x - max in
  log-softmax, the cubic weights of a resize), so their error is relative to the inputs as well.
* k(family): units of error of one evaluation, from the accuracy the backends document: 1 for
  correctly rounded arithmetic, 4 for math-library functions (glibc, SLEEF and CUDA's libdevice
  are within 4 ulp in float32), 2 for reductions and contractions, 4 for composites and graphs.

A float64 result is held to twice the computation term: its reference, also float64, computes with
errors of the same size (another formula for a resize's cubic weights, another order of a sum).

References that autograd cannot differentiate (NumPy, integer maps) give cond = 0, n = 1: their
results must be within k units of |ref|.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

import stitchml as sm

FAMILIES: dict[str, int] = {
    "elementwise": 1,  # +, -, *, /, sqrt, comparisons, movement: one correctly rounded operation
    "transcendental": 4,  # exp, log, pow, trigonometric, erf, sigmoid: a math library's evaluation
    "reduction": 2,  # sums, means, products, scans
    "contraction": 2,  # matrix products, convolutions, pooling
    "composite": 4,  # a composite of primitives, computed in float32 for half types
    "graph": 4,  # primitives in a row, each rounding to its result type (eager's half types)
}
HALF = (sm.float16, sm.bfloat16)


def eps(dtype: sm.DType) -> float:
    """Machine epsilon of a floating type: the distance from 1 to the next value."""
    return torch.finfo(dtype.torch).eps


def work(dtype: sm.DType, family: str) -> sm.DType:
    """The precision a result of `family` is computed in: float32 for half types, except in a graph."""
    return sm.float32 if dtype in HALF and family != "graph" else dtype


def sensitivity(fn: Callable[..., object], args: Sequence[torch.Tensor]) -> list[tuple | None]:
    """(cond, n, reach) per output of `fn(*args)`, shaped like the output; None where autograd cannot tell.

    `args` are the reference's float64 (or integer) inputs; `fn` returns a tensor or a sequence.
    """
    xs = [a.detach().clone().requires_grad_(True) if a.dtype == torch.float64 and a.numel() else a
          for a in args]
    leaves = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not leaves:
        return []
    try:
        with torch.enable_grad():
            outs = _flatten(fn(*xs))
    except Exception:  # noqa: BLE001  (a NumPy reference refuses tensors that need a gradient)
        return []
    found: list[tuple | None] = []
    for out in outs:
        if not (isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point()):
            found.append(None)
            continue
        found.append(_jacobian_scale(out, leaves))
    return found


def _flatten(value) -> list:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return [value]


def _jacobian_scale(out: torch.Tensor, leaves: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """sum_i |J_ji| |x_i|, the count of nonzero J_ji and the largest |x_i| among them, for every element j."""
    flat = out.reshape(-1)
    m = flat.numel()
    cond = torch.zeros(m, dtype=torch.float64)
    count = torch.zeros(m, dtype=torch.float64)
    reach = torch.zeros(m, dtype=torch.float64)
    sizes = sum(x.numel() for x in leaves)
    step = max(1, min(m, 2**22 // max(1, sizes)))  # rows per batch: a few tens of MB of Jacobian
    magnitudes = [x.detach().reshape(-1).abs() for x in leaves]
    # Rows of the Jacobian by batched backward passes (vmap), or one by one where that is faster (a
    # convolution's backward has no batching rule): the first row goes alone, the next eight batched,
    # and the faster way per row does the rest.
    batched, start, per_row = False, 0, None
    while start < m:
        rows = min(8, m - 1) if start == 1 else min(step, m - start) if batched and start else 1
        seeds = torch.zeros(rows, m, dtype=flat.dtype)
        seeds[torch.arange(rows), torch.arange(start, start + rows)] = 1.0
        began = time.perf_counter()
        if rows > 1:
            grads = torch.autograd.grad(flat, leaves, seeds, retain_graph=True, allow_unused=True,
                                        is_grads_batched=True)
        else:
            grads = [None if gr is None else gr[None] for gr in
                     torch.autograd.grad(flat, leaves, seeds[0], retain_graph=True, allow_unused=True)]
        took = (time.perf_counter() - began) / rows
        if start == 0:
            per_row = took
        elif start == 1:
            batched = took < per_row
        for gr, mag in zip(grads, magnitudes):
            if gr is None:
                continue
            gr = gr.reshape(rows, -1)
            term = torch.nan_to_num(gr.abs() * mag, nan=0.0, posinf=0.0)
            used = torch.nan_to_num(gr, nan=0.0) != 0
            cond[start:start + rows] += term.sum(1)
            count[start:start + rows] += used.sum(1)
            size = torch.where(used, torch.nan_to_num(mag, posinf=0.0), 0.0).amax(1) if mag.numel() else reach[:rows]
            reach[start:start + rows] = torch.maximum(reach[start:start + rows], size)
        start += rows
    return cond.reshape(out.shape), count.reshape(out.shape), reach.reshape(out.shape)


def allowed(dtype: sm.DType, family: str, reference: torch.Tensor, scale: tuple | None = None) -> torch.Tensor:
    """The largest error the rule allows each element of a `dtype` result of `family`."""
    r = reference.double().abs()
    if scale is None:
        spread = r
    else:
        cond, n, reach = scale
        spread = r + n.clamp(min=1.0).sqrt() * (cond + reach if family in ("composite", "graph") else cond)
    e = eps(dtype)
    k = FAMILIES[family] * (2 if dtype == sm.float64 else 1)
    return e * r + k * eps(work(dtype, family)) * spread + e * torch.finfo(dtype.torch).tiny


def assert_within(actual: torch.Tensor, reference: torch.Tensor, family: str, what: str,
                  scale: tuple | None = None) -> None:
    """`actual` obeys the rule against the float64 `reference` (exactly equal for integer and bool results)."""
    reference = torch.as_tensor(reference)
    assert tuple(actual.shape) == tuple(reference.shape), \
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(reference.shape)}"
    if not actual.dtype.is_floating_point:
        want = reference.bool() if actual.dtype == torch.bool else reference.to(actual.dtype)
        wrong = (actual != want).nonzero()
        assert len(wrong) == 0, (f"{what}: {len(wrong)} of {actual.numel()} elements differ, first at "
                                 f"{tuple(wrong[0].tolist())}: {actual[tuple(wrong[0])]} vs {want[tuple(wrong[0])]}")
        return
    dtype = sm.as_dtype(actual.dtype)
    a, r = actual.double(), reference.double()
    rounded = reference.to(actual.dtype).double()
    tol = allowed(dtype, family, r, scale)
    ok = (a == r) | (a == rounded) | (a.isnan() & r.isnan()) | (r.isfinite() & ((a - r).abs() <= tol))
    wrong = (~ok).nonzero()
    if len(wrong):
        shown = [(tuple(w.tolist()), a[tuple(w)].item(), r[tuple(w)].item(), tol[tuple(w)].item()) for w in wrong[:4]]
        raise AssertionError(f"{what}: {len(wrong)} of {a.numel()} elements of {dtype} ({family}) are beyond the "
                             f"float64 reference's tolerance; (index, actual, reference, allowed): {shown}")

