"""Shape buckets: one executable serves every size of a dynamic dimension up to its bucket.

A bucket spec maps placeholders to {axis: rule}; a rule rounds a size up:

* ``"pow2"``: the next power of two (33 -> 64);
* an int N: the next multiple of N (33 -> 48 for N=16);
* a sequence of edges: the first edge at least the size (33 -> 100 for (10, 100, 1000)); a size above
  the last edge is not bucketed (compiled for its exact shape).

    >>> bucket_size(33, "pow2"), bucket_size(33, 16), bucket_size(33, (10, 100)), bucket_size(200, (10, 100))
    (64, 48, 100, None)

`pad_graph` builds a twin of the graph for the bucket sizes. Each padded dimension becomes a symbol; symbols
that meet (an elementwise op, a contraction) are one class, with one mask placeholder (``arange(L) < n``) and
one count placeholder (n, float32). The twin masks before any op that mixes positions along a padded axis:
a reduction over it reads the combine's neutral (the value its kernel puts in masked lanes, so the padded run
reduces exactly what the unpadded one does), a mean divides the masked sum by the real count, a matrix
product over a padded contraction axis reads zeros in both operands. Ops that keep positions apart
(elementwise ops, transposes, reshapes that keep a padded axis whole, slices and concatenations along other
axes) carry the padding through. Any other op that reads a padded axis, variables and random draws make
`pad_graph` refuse (`Refused`, saying why); the caller then compiles for the exact shapes.

A `BucketedExecutable` pads the feeds by repeating their last real entry (so padded lanes compute values the
real lanes compute: no new zero divisors or NaNs), feeds the masks and counts, and slices the results back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..dtypes import bool_, float32
from ..errors import FeedError, ShapeError
from ..graph import Graph
from ..ir import Tensor, TensorType, needed_ops
from ..ops.movement import swap_permutation
from ..registry import ELEMENTWISE, lookup
from ..tensor_data import TensorData

_NEUTRAL = {"reduction_sum": "zero", "reduction_mean": "zero", "reduction_product": "one",
            "reduction_maximum": "low", "reduction_arg_maximum": "low",
            "reduction_minimum": "high", "reduction_arg_minimum": "high"}
_FLAT = ("reshape", "expand_dims", "squeeze")  # views that keep the flat order


class Refused(Exception):
    """The graph cannot be bucketed as asked; the message says which op and why."""


def bucket_size(n: int, rule: Any) -> int | None:
    """`n` rounded up by `rule` (see the module docstring); None when `n` is not bucketed."""
    if n <= 0:
        return None
    if rule == "pow2":
        return 1 << (n - 1).bit_length()
    if isinstance(rule, int) and not isinstance(rule, bool) and rule > 0:
        return -(-n // rule) * rule
    if isinstance(rule, (list, tuple)) and rule and all(isinstance(e, int) and e > 0 for e in rule):
        return next((e for e in sorted(rule) if e >= n), None)
    raise FeedError(f"buckets: a rule must be 'pow2', a positive int or a sequence of positive ints, got {rule!r}")


def check_spec(graph, spec) -> dict[Tensor, dict[int, Any]]:
    """`spec` as {placeholder: {axis (non-negative): rule}}; FeedError for anything else."""
    if not isinstance(spec, dict):
        raise FeedError(f"buckets: expected {{placeholder: {{axis: rule}}}}, got {type(spec).__name__}")
    out = {}
    for key, axes in spec.items():
        if not isinstance(key, Tensor) or key.graph is not graph or key.op.op != "placeholder":
            raise FeedError(f"buckets: keys must be placeholders of graph {graph.name!r}, got {key!r}")
        if not isinstance(axes, dict) or key.shape is None:
            raise FeedError(f"buckets: placeholder {key.name} needs a known rank and {{axis: rule}}, got {axes!r}")
        rules = {}
        for axis, rule in axes.items():
            if not isinstance(axis, int) or not -key.rank <= axis < key.rank:
                raise FeedError(f"buckets: placeholder {key.name} has rank {key.rank}, got axis {axis!r}")
            bucket_size(1, rule)  # checks the rule
            rules[axis % key.rank] = rule
        out[key] = rules
    return out


def bucket_types(spec, feed_types: dict[Tensor, TensorType]) -> dict[Tensor, TensorType]:
    """The feeds' types with each bucketed extent rounded up."""
    out = {}
    for t, tt in feed_types.items():
        shape = list(tt.shape)
        for axis, rule in spec.get(t, {}).items():
            if axis < len(shape):
                shape[axis] = bucket_size(shape[axis], rule) or shape[axis]
        out[t] = TensorType(tuple(shape), tt.dtype)
    return out


@dataclass
class Padded:
    """The twin graph for one set of bucket sizes, and how to feed it and read it back."""

    graph: Graph
    feeds: dict[Tensor, tuple[Tensor, dict[int, int]]]  # user placeholder -> (twin placeholder, {axis: class})
    masks: dict[int, Tensor]  # class -> bool placeholder (L,)
    counts: dict[int, Tensor]  # class -> float32 placeholder ()
    targets: list[tuple[Tensor, dict[int, int]]]  # per user target: (twin tensor, {axis: class})
    sizes: dict[int, int] = field(default_factory=dict)  # class -> bucket size


class _Twin:
    def __init__(self, graph: Graph):
        self.g = Graph(f"{graph.name}/bucketed")
        self.parent: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.masks: dict[int, Tensor] = {}
        self.counts: dict[int, Tensor] = {}

    def new_symbol(self, size: int) -> int:
        s = len(self.parent)
        self.parent[s], self.size[s] = s, size
        return s

    def find(self, s: int) -> int:
        while self.parent[s] != s:
            s = self.parent[s]
        return s

    def unify(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        self.parent[b] = a
        return a

    def mask(self, x: Tensor, axis: int, sym: int, value) -> Tensor:
        """`x` with the padded positions along `axis` replaced by `value`."""
        c = self.find(sym)
        if c not in self.masks:
            self.masks[c] = self.g.placeholder((self.size[c],), bool_, name=f"bucket_mask{c}")
        m = self.g.reshape(self.masks[c], (self.size[c],) + (1,) * (x.rank - axis - 1))
        return self.g.select(m, x, self.g.constant(torch.tensor(value, dtype=x.dtype.torch)))

    def count(self, sym: int) -> Tensor:
        c = self.find(sym)
        if c not in self.counts:
            self.counts[c] = self.g.placeholder((), float32, name=f"bucket_count{c}")
        return self.counts[c]


def _neutral(kind: str, dtype) -> Any:
    if kind == "zero":
        return False if dtype.is_bool else 0
    if kind == "one":
        return True if dtype.is_bool else 1
    if dtype.is_bool:
        return kind == "high"
    if dtype.is_floating:
        return -math.inf if kind == "low" else math.inf
    info = torch.iinfo(dtype.torch)
    return info.min if kind == "low" else info.max


def _aligned(twin: _Twin, op, shapes: list[tuple], syms: list[dict[int, int]], out: tuple) -> dict[int, int]:
    """Symbols of a broadcasting op's output (of shape `out`): each padded input axis where the input does
    not broadcast; inputs padded along one output axis are one class."""
    result: dict[int, int] = {}
    for i in range(len(out)):
        found, static = None, False
        for shape, s in zip(shapes, syms):
            a = i - (len(out) - len(shape))
            if a < 0 or shape[a] != out[i]:
                continue
            if a in s:
                found = s[a] if found is None else twin.unify(found, s[a])
            elif shape[a] > 1:
                static = True
        if found is not None:
            if static:
                raise Refused(f"{op.op} ({op.name}) combines a padded axis with a fixed extent of {out[i]}")
            result[i] = found
    return result


def _shapes(ins: list[Tensor]) -> list[tuple]:
    return [t.shape for t in ins]


def _flat(op, x: Tensor, sym: dict[int, int], out: Tensor) -> dict[int, int]:
    """A view in flat order keeps a padded axis when it stays one axis with the same extent outside it."""
    result = {}
    for a, s in sym.items():
        outer = math.prod(x.shape[:a])
        b = next((b for b in range(out.rank) if math.prod(out.shape[:b]) == outer and out.shape[b] == x.shape[a]),
                 None)
        if b is None:
            raise Refused(f"{op.op} ({op.name}) merges or splits padded axis {a} of {x.name}")
        result[b] = s
    return result


def _emit(twin: _Twin, op, ins: list[Tensor], attrs=None) -> list[Tensor]:
    try:
        return list(twin.g._emit(op.op, ins, op.attrs if attrs is None else attrs, op.name).outputs)
    except ShapeError as e:
        raise Refused(f"{op.op} ({op.name}) does not build at the bucket sizes: {e}") from None


def _reduction(twin: _Twin, op, x: Tensor, sym: dict[int, int]) -> tuple[list[Tensor], dict[int, int]]:
    if op.op not in _NEUTRAL:
        raise Refused(f"{op.op} ({op.name}) reduces {x.name}, padded along {sorted(sym)}")
    arg = op.op.startswith("reduction_arg")
    axes = (op.attrs["axis"] % x.rank,) if arg else \
        tuple(range(x.rank)) if op.attrs["axes"] is None else tuple(a % x.rank for a in op.attrs["axes"])
    keep = op.attrs["keep_dims"]
    masked = x
    for a in axes:
        if a in sym:
            masked = twin.mask(masked, a, sym[a], _neutral(_NEUTRAL[op.op], x.dtype))
    kept = {(a if keep else a - sum(1 for r in axes if r < a)): s for a, s in sym.items() if a not in axes}
    if op.op != "reduction_mean" or not any(a in sym for a in axes):
        return _emit(twin, op, [masked]), kept
    if x.dtype.name not in ("float32", "float64"):
        raise Refused(f"{op.op} ({op.name}) of {x.dtype} over a padded axis (float32 and float64 only)")
    total = twin.g.constant(np.float32(math.prod(x.shape[a] for a in axes if a not in sym)))
    for a in axes:
        if a in sym:
            total = total * twin.count(sym[a])
    summed = twin.g.reduction_sum(masked, axes, keep_dims=keep, name=op.name)
    return [summed / (total if x.dtype == float32 else twin.g.cast(total, x.dtype))], kept


def _matmul(twin: _Twin, op, a: Tensor, b: Tensor, sa: dict[int, int], sb: dict[int, int]):
    ka, kb = sa.get(a.rank - 1), sb.get(b.rank - 2)
    if (ka is None) != (kb is None):
        raise Refused(f"{op.op} ({op.name}) contracts a padded axis with a fixed one")
    if ka is not None:
        twin.unify(ka, kb)
        a, b = twin.mask(a, a.rank - 1, ka, 0), twin.mask(b, b.rank - 2, kb, 0)
    (out,) = _emit(twin, op, [a, b])
    batch = [{i: s for i, s in sa.items() if i < a.rank - 2}, {i: s for i, s in sb.items() if i < b.rank - 2}]
    result = _aligned(twin, op, [a.shape[:-2], b.shape[:-2]], batch, out.shape[:-2])
    if a.rank - 2 in sa:
        result[out.rank - 2] = sa[a.rank - 2]
    if b.rank - 1 in sb:
        result[out.rank - 1] = sb[b.rank - 1]
    return [out], result


def _step(twin: _Twin, op, ins: list[Tensor], syms: list[dict[int, int]]) -> tuple[list[Tensor], list[dict]]:
    """The twin's outputs of `op` and their symbols."""
    prim = lookup(op.op)
    if not any(syms):
        return _emit(twin, op, ins), [{} for _ in op.outputs]
    if prim.kind == ELEMENTWISE:
        outs = _emit(twin, op, ins)
        return outs, [_aligned(twin, op, _shapes(ins), syms, outs[0].shape)]
    if op.op in _NEUTRAL:
        outs, sym = _reduction(twin, op, ins[0], syms[0])
        return outs, [sym]
    if op.op == "matrix_multiplication":
        outs, sym = _matmul(twin, op, ins[0], ins[1], syms[0], syms[1])
        return outs, [sym]
    if op.op in _FLAT:
        outs = _emit(twin, op, ins)
        return outs, [_flat(op, ins[0], syms[0], outs[0])]
    if op.op == "transpose":
        outs = _emit(twin, op, ins)
        perm = op.attrs.get("permutation") or swap_permutation(op.attrs["swap"], ins[0].rank)
        return outs, [{i: syms[0][p] for i, p in enumerate(perm) if p in syms[0]}]
    if op.op == "broadcast_to":
        outs = _emit(twin, op, ins)
        return outs, [_aligned(twin, op, _shapes(ins), syms, outs[0].shape)]
    if op.op == "slice":
        x = ins[0]
        for a in syms[0]:
            start, stride = op.attrs["starts"][a], (op.attrs["strides"] or (1,) * x.rank)[a]
            if start not in (0, None) or stride != 1 or op.attrs["ends"][a] not in (None,) and \
                    op.attrs["ends"][a] < op.inputs[0].shape[a]:
                raise Refused(f"slice ({op.name}) cuts padded axis {a} of {x.name}")
        outs = _emit(twin, op, ins)
        return outs, [dict(syms[0])]
    if op.op == "concat":
        axis = op.attrs["axis"] % ins[0].rank
        if any(axis in s for s in syms):
            raise Refused(f"concat ({op.name}) joins along padded axis {axis}")
        outs = _emit(twin, op, ins)
        return outs, [_aligned(twin, op, _shapes(ins), syms, outs[0].shape)]
    padded = next(t for t, s in zip(op.inputs, syms) if s)
    raise Refused(f"{op.op} ({op.name}) reads {padded.name}, which is padded: it may mix padded positions")


def pad_graph(graph, spec, feed_types: dict[Tensor, TensorType], targets: Sequence[Tensor]) -> Padded:
    """The twin of `graph` for the bucket sizes of `feed_types` (see the module docstring); Refused if the
    graph cannot be bucketed as `spec` asks."""
    twin = _Twin(graph)
    sizes = bucket_types(spec, feed_types)
    new: dict[int, Tensor] = {}
    syms: dict[int, dict[int, int]] = {}
    feeds = {}
    for op in needed_ops(graph.operations, [t.op for t in targets]):
        if op.op == "placeholder":
            t = op.outputs[0]
            if t not in feed_types:
                raise Refused(f"placeholder {t.name} is not fed")
            tt = sizes[t]
            p = twin.g.placeholder(tt.shape, tt.dtype, name=t.name)
            sym = {a: twin.new_symbol(tt.shape[a]) for a, rule in spec.get(t, {}).items()
                   if bucket_size(feed_types[t].shape[a], rule) is not None}
            new[t.id], syms[t.id] = p, sym
            feeds[t] = (p, sym)
            continue
        if op.op in ("variable", "read_variable", "assign_variable") or lookup(op.op).kind == "random":
            raise Refused(f"{op.op} ({op.name}): graphs with variables or random draws are compiled per shape")
        outs, out_syms = _step(twin, op, [new[t.id] for t in op.inputs], [syms[t.id] for t in op.inputs])
        for t, n, s in zip(op.outputs, outs, out_syms):
            new[t.id], syms[t.id] = n, s
    find = twin.find
    return Padded(twin.g, {t: (p, {a: find(s) for a, s in sym.items()}) for t, (p, sym) in feeds.items()},
                  twin.masks, twin.counts, [(new[t.id], {a: find(s) for a, s in syms[t.id].items()}) for t in targets],
                  {c: twin.size[c] for c in set(map(find, twin.parent))})


def _pad(t: torch.Tensor, axes: dict[int, int]) -> torch.Tensor:
    """`t` padded along each axis to its bucket size by repeating the last entry."""
    for axis, size in axes.items():
        n = t.shape[axis]
        if size != n:
            index = torch.arange(size, device=t.device).clamp_(max=n - 1)
            t = t.index_select(axis, index)
    return t


class BucketedExecutable:
    """Runs an executable of a padded twin for any feed sizes within its buckets; results as unpadded runs."""

    def __init__(self, padded: Padded, exe, spec, label: str, targets: Sequence[Tensor]):
        self.padded, self.exe, self.spec, self.label = padded, exe, spec, label
        self._targets = list(targets)
        self.device = exe.device
        self.last_bucket = ""

    def __getattr__(self, name: str):  # reports (kernel_count, fusion_report...) are the twin's
        return getattr(self.__dict__["exe"], name)

    def sizes(self, feeds: dict) -> dict[int, int] | None:
        """The real size of each class for these feeds; None when they do not fit this executable."""
        real: dict[int, int] = {}
        for user, (p, sym) in self.padded.feeds.items():
            value = feeds.get(user)
            if value is None:
                return None
            shape = tuple(value.shape)
            if len(shape) != p.rank:
                return None
            for a, d in enumerate(shape):
                if a in sym:
                    c = sym[a]
                    if d > self.padded.sizes[c] or real.setdefault(c, d) != d:
                        return None
                    if bucket_size(d, self.spec[user][a]) != p.shape[a]:
                        return None
                elif d != p.shape[a]:
                    return None
        return real

    def run(self, feeds: dict | None = None, **kwargs) -> dict[Tensor, TensorData]:
        """Pad the feeds, run the twin, slice the results (keyword arguments go to the twin's run)."""
        feeds = feeds or {}
        real = self.sizes(feeds)
        if real is None:
            raise FeedError(f"the feeds do not fit bucket {self.label}; compile again for them")
        inner = {}
        for user, (p, sym) in self.padded.feeds.items():
            value = feeds[user]
            t = value.torch() if isinstance(value, TensorData) else TensorData(value).torch()
            inner[p] = _pad(t.to(self.device), {a: self.padded.sizes[c] for a, c in sym.items()})
        for c, m in self.padded.masks.items():
            inner[m] = torch.arange(self.padded.sizes[c], device=self.device) < real[c]
        for c, n in self.padded.counts.items():
            inner[n] = torch.tensor(float(real[c]), dtype=torch.float32, device=self.device)
        out = self.exe.run(inner, **kwargs)
        self.last_bucket = f"{self.label} for " + ", ".join(
            f"{u.name}: {list(feeds[u].shape)}" for u in self.padded.feeds)
        result = {}
        for user, (t, sym) in zip(self._targets, self.padded.targets):
            v = out[t].torch()
            if sym:
                v = v[tuple(slice(0, real[sym[a]]) if a in sym else slice(None) for a in range(v.dim()))].contiguous()
            result[user] = TensorData._wrap(v)
        return result
