"""Records of the scans, sorting and Einstein summation: cumulative_sum, top_k and einsum.

References are written from the definitions, not with the functions the
implementations call: a running sum is a product with a triangular matrix of
ones, the top k come from NumPy's stable lexicographic sort (NaN largest, as
NumPy orders it), and an Einstein sum multiplies the operands broadcast over
every label, takes diagonals for repeated labels and sums the labels the
output leaves out.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import stitchml as sm

from .core import ALL, NUMERIC, ErrorInput, OpInfo, P, Sample, exact, make

_LAYOUTS = ("transposed", "sliced")


# -- cumulative_sum ----------------------------------------------------------------------------
def _cumsum_samples(record, dtype, rng):
    for name, shape, kwargs, more in [("vector", (5,), {}, (7,)),
                                      ("rows-exclusive", (3, 4), {"axis": 0, "exclusive": True}, (1, 4)),
                                      ("last-reverse", (2, 3, 4), {"axis": -1, "reverse": True}, (3, 1, 2)),
                                      ("middle-both", (2, 3, 4), {"axis": 1, "exclusive": True, "reverse": True},
                                       (1, 5, 2)),
                                      ("zero-size", (0, 3), {"axis": 1}, (2, 3)),
                                      ("empty-axis", (2, 0), {"axis": 1, "exclusive": True}, (1, 3))]:
        yield Sample((make(shape, dtype, rng),), kwargs, name=name, more=((make(more, dtype, rng),),))
    for layout in _LAYOUTS:
        yield Sample((make((3, 4), dtype, rng, layout=layout),), {"axis": 1, "exclusive": True}, name=layout)
    if dtype.is_floating:
        # Each element is left out of its own sum, not subtracted from it: inf - inf would be NaN.
        for reverse in (False, True):
            yield Sample((exact([math.inf, 1.0, -2.0, math.inf], dtype),), {"exclusive": True, "reverse": reverse},
                         name=f"infinities-{'reverse' if reverse else 'forward'}", grad=False)


def _cumsum_ref(x, axis=0, exclusive=False, reverse=False):
    """out[..., i, ...] = sum of x[..., j, ...] over j <= i (j >= i when reversed; j != i when exclusive)."""
    n = x.shape[axis]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = (j >= i if reverse else j <= i) & ((j != i) if exclusive else True)
    exact_type = x.dtype if x.dtype.is_floating_point else torch.int64  # integers wrap as the result type does
    rows = x.movedim(axis, -1).to(exact_type).unsqueeze(-2)
    total = torch.where(torch.from_numpy(keep), rows, torch.zeros((), dtype=exact_type)).sum(dim=-1)
    return total.movedim(-1, axis).to(torch.int64 if x.dtype == torch.bool else x.dtype)


def _cumsum_errors():
    return [ErrorInput((P((2, 3)),), {"axis": 2}, match="out of range for rank 2"),
            ErrorInput((P(None),), {"axis": -3}, error=sm.ExecutionError, match="failed on inputs",
                       feeds=(np.ones((2, 3), np.float32),))]


# -- top_k ---------------------------------------------------------------------------------------
def _top_k_samples(record, dtype, rng):
    for name, shape, kwargs, more in [("last", (3, 5), {"k": 2}, (1, 4)),
                                      ("first-smallest", (4, 3), {"k": 3, "axis": 0, "largest": False}, (6, 2)),
                                      ("all", (5,), {"k": 5}, (5,)),
                                      ("none", (2, 4), {"k": 0}, (3, 1)),
                                      ("zero-size", (0, 4), {"k": 2}, (2, 3))]:
        yield Sample((make(shape, dtype, rng),), kwargs, name=name, unranked=False, more=((make(more, dtype, rng),),))
    for layout in _LAYOUTS:
        yield Sample((make((3, 4), dtype, rng, layout=layout),), {"k": 2, "axis": 0}, name=layout, unranked=False)
    # Ties: the lower index comes first; a gradient check would move the tie.
    yield Sample((make((3, 6), dtype, rng, values=[-1, 0, 1]),), {"k": 4}, name="ties", unranked=False, grad=False)
    yield Sample((make((3, 6), dtype, rng, values=[-1, 0, 1]),), {"k": 4, "largest": False}, name="ties-smallest",
                 unranked=False, grad=False)
    if dtype.is_floating:
        specials = exact([math.nan, 1.0, -math.inf, math.inf, 0.0, math.nan, -0.0], dtype)
        for largest in (True, False):
            yield Sample((specials,), {"k": 4, "largest": largest}, name=f"specials-{largest}", unranked=False,
                         grad=False)


def _top_k_ref(x, k, axis=-1, largest=True):
    """NumPy's stable lexicographic order per row: NaN is the largest value, ties keep the lower index first."""
    values = x.detach().movedim(axis, -1)
    rows = values.reshape(-1, values.shape[-1]).to(torch.float64).numpy()
    nan, finite = np.isnan(rows), np.where(np.isnan(rows), 0.0, rows)
    sign = -1 if largest else 1
    order = np.array([np.lexsort((np.arange(r.size), sign * f, sign * n.astype(np.int64)))
                      for r, f, n in zip(rows, finite, nan)], dtype=np.int64).reshape(values.shape)[..., :k]
    index = torch.from_numpy(order).movedim(-1, axis)
    return torch.take_along_dim(x, index, dim=axis), index


def _top_k_errors():
    return [ErrorInput((P((2, 3)),), {"k": 4}, match="k=4 is outside [0, 3] for axis 1"),
            ErrorInput((P((2, -1)),), {"k": -1}, match="k=-1 must be >= 0"),
            ErrorInput((P((2, 3)),), {"k": 1, "axis": 2}, match="out of range for rank 2"),
            ErrorInput((P(None),), {"k": 1}, match="needs a tensor of known rank"),
            ErrorInput((P((-1,)),), {"k": 3}, error=sm.ExecutionError, match="k=3 is more than the extent 2 of axis 0",
                       feeds=(np.ones(2, np.float32),))]


# -- einsum ----------------------------------------------------------------------------------------
_EINSUMS = [
    ("matmul", "ij,jk->ik", [(2, 3), (3, 4)], [(5, 3), (3, 1)]),
    ("implicit", "jk,ij", [(3, 4), (2, 3)], [(2, 1), (5, 2)]),
    ("batch", "bij,bjk->bik", [(2, 2, 3), (2, 3, 4)], [(1, 3, 2), (1, 2, 2)]),
    ("transpose", "ij->ji", [(3, 4)], [(1, 2)]),
    ("sum-axes", "ijk->ik", [(2, 3, 4)], [(1, 2, 3)]),
    ("outer", "i,j->ij", [(3,), (4,)], [(1,), (2,)]),
    ("dot", "i,i->", [(5,), (5,)], [(2,), (2,)]),
    ("three", "ij,jk,kl->il", [(2, 3), (3, 2), (2, 4)], [(1, 2), (2, 3), (3, 2)]),
    ("ellipsis-broadcast", "...ij,...jk->...ik", [(2, 1, 2, 3), (3, 3, 4)], [(1, 2, 1, 2), (2, 2, 2)]),
    ("ellipsis-inside", "i...j,j->i...", [(2, 3, 4), (4,)], [(3, 1, 2), (2,)]),
    ("ellipsis-summed", "...ij->ij", [(2, 3, 4)], [(1, 2, 2)]),
    ("label-broadcast", "ij,jk->ik", [(2, 1), (3, 4)], [(2, 1), (2, 2)]),
    ("trace", "ii->", [(3, 3)], [(4, 4)]),
    ("diagonal", "ii->i", [(3, 3)], [(2, 2)]),
    ("diagonal-product", "iij,jk->ki", [(2, 2, 3), (3, 4)], [(3, 3, 1), (1, 2)]),
    ("uppercase-spaces", " Ab , bC -> CA ", [(2, 3), (3, 4)], [(1, 1), (1, 2)]),
    ("scalars", ",->", [(), ()], [(), ()]),
    ("zero-size", "ij,jk->ik", [(0, 3), (3, 2)], [(2, 0), (0, 3)]),
]


def _einsum_samples(record, dtype, rng):
    def operands(shapes, layout="contiguous"):
        return tuple(make(s, dtype, rng, -1.0, 1.0, layout=layout if len(s) > 1 else "contiguous") for s in shapes)

    for name, equation, shapes, more in _EINSUMS:
        yield Sample(operands(shapes), {"equation": equation}, name=name, more=(operands(more),))
    for layout in _LAYOUTS:
        yield Sample(operands([(3, 4), (4, 2)], layout), {"equation": "ij,jk->ik"}, name=layout)


def _einsum_build(g, *operands, equation):
    return g.einsum(equation, *operands)


def _einsum_ref(*xs, equation):
    """Operands broadcast over every label and multiplied; labels the output leaves out are summed."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if not arrow:
        letters = [c for c in lhs if c.isalpha()]
        rhs = ("..." if "..." in lhs else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ell_rank = max([x.dim() - len(t.replace("...", "")) for x, t in zip(xs, terms) if "..." in t], default=0)
    ell = [f"...{i}" for i in range(ell_rank)]  # one label per broadcast axis, aligned from the right

    def labels(term, rank):
        head, dots, tail = term.partition("...")
        return list(head) + (ell[ell_rank - (rank - len(head) - len(tail)):] if dots else []) + list(tail)

    exact_type = xs[0].dtype if xs[0].dtype.is_floating_point else torch.int64
    views = []
    for x, term in zip(xs, terms):
        names, x = labels(term, x.dim()), x.to(exact_type)
        for c in dict.fromkeys(names):
            while names.count(c) > 1:  # a repeated label: its diagonal, moved last
                a = names.index(c)
                b = names.index(c, a + 1)
                x = torch.diagonal(x, dim1=a, dim2=b)
                names = [n for i, n in enumerate(names) if i not in (a, b)] + [c]
        views.append((x, names))
    out = labels(rhs, len(rhs.replace("...", "")) + ell_rank)
    every = out + [c for _, names in views for c in names if c not in out]
    every = list(dict.fromkeys(every))
    product = torch.ones((), dtype=exact_type)
    for x, names in views:
        aligned = x.permute([names.index(c) for c in every if c in names])
        product = product * aligned.reshape([x.shape[names.index(c)] if c in names else 1 for c in every])
    total = product.sum(dim=tuple(range(len(out), len(every)))) if len(every) > len(out) else product
    return total.to(xs[0].dtype)


def _einsum_errors():
    return [ErrorInput((P((2, 3)),), {"equation": "ij,jk->ik"}, match="has 2 terms for 1 operands"),
            ErrorInput((P((2, 3)),), {"equation": "ijk->k"}, match="term 'ijk' does not fit rank 2"),
            ErrorInput((P((2, 3)), P((3, 4))), {"equation": "ij,kk->ik"}, match="label 'k' has extents 3 and 4"),
            ErrorInput((P((1, 3)),), {"equation": "ii->i"}, match="label 'i' has extents 1 and 3"),
            ErrorInput((P((2, 3)), P((3, 4))), {"equation": "ij,jk->ix"}, match="output label 'x' is in no operand"),
            ErrorInput((P((2, 3)), P((3, 4))), {"equation": "ij,jk->ii"}, match="output label 'i' is repeated"),
            ErrorInput((P((2, 3)),), {"equation": "ij->j->i"}, match="is not an equation"),
            ErrorInput((P((2, 3)), P((3, 4))), {"equation": "i1,jk"}, match="is not an equation"),
            ErrorInput((P((2, 3)),), {"equation": "i...j...->ij"}, match="is not an equation"),
            ErrorInput((P((2, 3), sm.bool), P((3, 4), sm.bool)), {"equation": "ij,jk"},
                       match="expects numeric operands, got bool"),
            ErrorInput((P((-1, 3)), P((-1, 4))), {"equation": "ij,ik->jk"}, error=sm.ExecutionError,
                       match="failed on inputs", feeds=(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)))]


RECORDS = [
    OpInfo("cumulative_sum", _cumsum_samples, _cumsum_ref, ALL, errors=_cumsum_errors,
           out_dtype=lambda dtype, kwargs: sm.int64 if dtype.is_bool else dtype, second_order=True,
           equivalent="np.cumsum / torch.cumsum (exclusive, reverse: tf.math.cumsum)"),
    OpInfo("top_k", _top_k_samples, _top_k_ref, ALL, errors=_top_k_errors, unranked=False, second_order=True,
           out_dtype=lambda dtype, kwargs: (dtype, sm.int64), equivalent="torch.topk (sorted, stable)"),
    OpInfo("einsum", _einsum_samples, _einsum_ref, NUMERIC, build=_einsum_build, errors=_einsum_errors,
           second_order=True, equivalent="np.einsum / torch.einsum"),
]
