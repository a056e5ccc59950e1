"""A fuzzer of the stitching compiler: random graphs, compiled against eager on the CPU.

Hypothesis draws a *recipe*: a list of steps (placeholders of small random shapes and dtypes,
elementwise unary, binary and ternary ops with broadcasting and mixed dtypes, reductions with
keep_dims over random axes, matrix products and convolutions, reshape / transpose / broadcast_to / slice /
expand_dims / squeeze / reverse / tile / pad / concat / gather / gather_along_axis / split, casts;
index reductions of exact values) and the values to return. `build` replays a recipe into a graph; the
compiled run must equal the eager run: integers and bools exactly, NaN and infinities at the same
places, other floats within an error bound carried along the steps.

Why a bound, and how. This is the tolerance rule of tests/tolerance.py carried along the steps, since
a random graph has no float64 reference of its own: the same eps per dtype, the same units of error per
op family (correctly rounded arithmetic, math-library functions), and `err` in place of the rule's
condition term. Kernels compute half types in float32 and round where they store, eager
rounds after every op, and the two use different math libraries: results differ by rounding, and
by more where an op magnifies an earlier difference. Every value carries `bound` (the largest
magnitude its finite elements can have) and `err` (how far from exact arithmetic either run can
be, first order: each op scales its operands' errors by its Lipschitz constant on their range and
adds its own rounding). Steps keep this small: ops with singular points get a guard that keeps
them away (log(|x| + 1/2), 1/(|x| + 1/2), tan(tanh x)...), and values are scaled down by powers
of two (exact) before an op would grow them past LIMIT, so half types never overflow. Values also
carry `exact`: both runs hold the same bits (inputs, casts, movement, sign changes, extrema, and
float32 / float64 arithmetic that IEEE rounds alike, but no math library call, no sum in another
order, and nothing a kernel keeps in float32 where eager rounds to a half type). Exact results must
match bit for bit, and ops that jump (comparisons, floor, casts to integers...) only take exact
operands, so both runs jump alike.

Which ops are drawn, and how, is the op database's: each record's `fuzz` (tests/opdb/core.py, `Fuzz`)
gives its role, guards, fits and error growth; tests/test_opdb_complete.py fails when an op has neither
a `fuzz` nor a reasoned exclusion (tests/opdb/coverage.py).

Failing recipes found while developing stay as regression tests in tests/fuzz_regressions/: a
failure prints its recipe as JSON, which goes into one of the lists there.
"""
from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import stitchml as sm

from compiler_util import operands, values
from opdb import OPS
from tolerance import FAMILIES, eps

pytestmark = pytest.mark.usefixtures("triton_interpreter")

LIMIT = 64.0  # largest magnitude a float value may reach (float16 holds up to 65504)
FLOAT_TYPES = (sm.float16, sm.bfloat16, sm.float32, sm.float64)
ULP = {dt: eps(dt) for dt in FLOAT_TYPES}
TINY = {dt: eps(dt) * torch.finfo(dt.torch).tiny for dt in FLOAT_TYPES}  # the subnormal step
REGRESSIONS = pathlib.Path(__file__).parent / "fuzz_regressions"


@dataclass
class Value:
    """A step's tensor, with what both runs are known to agree on.

    `exact`: both runs hold the same bits (so an op that jumps, a comparison, floor or a cast to an
    integer, may take it); `bound`: no finite element is larger in magnitude; `err`: neither run is
    further than this from exact arithmetic on the inputs.
    """

    tensor: sm.Tensor
    bound: float
    err: float = 0.0
    exact: bool = True

    @property
    def dtype(self) -> sm.DType:
        return self.tensor.dtype

    @property
    def shape(self) -> tuple:
        return self.tensor.shape


def _rounding(dtype: sm.DType, bound: float, ulps: float = 1.0) -> float:
    return ulps * ULP[dtype] * bound + TINY[dtype] if dtype.is_floating else 0.0


def _rounds_alike(dtype: sm.DType) -> bool:
    """Whether a correctly rounded op gives both runs the same bits: not for half types, which a
    kernel keeps in float32 for the next op while eager rounds them first."""
    return dtype not in (sm.float16, sm.bfloat16)


def _role(role: str) -> dict:
    """{op: its record's `Fuzz`} of the records of this role, in the op database's order."""
    return {name: r.fuzz for name, r in OPS.items() if r.fuzz is not None and r.fuzz.role == role}


UNARY, BINARY, REDUCTIONS, MOVES = _role("unary"), _role("binary"), _role("reduction"), _role("move")
ARG_REDUCTIONS = ("reduction_arg_maximum", "reduction_arg_minimum")  # of an exact operand, along one axis
JUMPS = [n for n in _role("jump") if operands(n) == 1]  # take exact operands; exact results
JUMP_BINARY = [n for n in _role("jump") if operands(n) == 2]
# The roles of one op each, built by Replay's _matmul, _conv, _cast, _select and _clamp.
BUILT_IN = {"matmul": "matrix_multiplication", "conv": "convolution2d", "cast": "cast", "select": "select",
            "clamp": "clamp"}
GRAPH_GUARDS = ("half", "quarter", "tanh", "tanh34", "divisor")  # what Replay._guard applies


def _ulps(name: str) -> float:
    """Units of rounding of one evaluation: none for exact ops, else its family's (tests/tolerance.py)."""
    return 0 if OPS[name].fuzz.exact else FAMILIES[OPS[name].family]


PROFILES = {  # input dtypes of a lane, and how often each kind of step is drawn
    "float": ([sm.float32] * 4 + [sm.float64], dict(unary=4, binary=4, jump=2, reduce=2, matmul=1, move=2, cast=1,
                                                     conv=1)),
    "half": ([sm.float16, sm.bfloat16, sm.float16, sm.float32], dict(unary=4, binary=4, jump=1, reduce=2, matmul=1,
                                                                     move=2, cast=1)),
    "mixed": ([sm.float32, sm.float16, sm.bfloat16, sm.int32, sm.int8, sm.uint8, sm.int64, sm.bool],
              dict(unary=3, binary=4, jump=3, reduce=2, matmul=1, move=2, cast=3)),
    "layout": ([sm.float32, sm.float16, sm.int32], dict(unary=2, binary=3, jump=1, reduce=4, matmul=2, move=5,
                                                        cast=1)),
}


# -- replaying a recipe ------------------------------------------------------------------------
class Replay:
    """Builds a recipe's graph step by step; `values[i]` is the value of step i."""

    def __init__(self, recipe: dict):
        self.g = sm.Graph("fuzz")
        self.rng = np.random.default_rng(recipe["seed"])
        self.specials = recipe.get("specials", False)
        self.feeds: dict = {}
        self.values: list[Value] = []
        for step in recipe["steps"]:
            self.values.append(self.apply(step))

    def apply(self, step: list) -> Value:
        kind, args = step[0], step[1:]
        return getattr(self, f"_{kind}")(*args)

    # sources, movement and casts
    def _input(self, dtype: str, shape: list) -> Value:
        dt = sm.as_dtype(dtype)
        p = self.g.placeholder(tuple(shape), dt, name=f"in{len(self.feeds)}")
        self.feeds[p] = values(self.rng, shape, dt, low=-2.0, high=2.0, specials=self.specials and dt.is_floating)
        return Value(p, 4.0 if dt.is_integer else 2.0)

    def _scale(self, i: int, k: int) -> Value:
        v = self.values[i]
        return Value(v.tensor * 2.0**-k, v.bound * 2.0**-k, v.err * 2.0**-k, v.exact and _rounds_alike(v.dtype))

    def _move(self, i: int, op: str, arg) -> Value:
        v = self.values[i]
        x = v.tensor
        if op == "slice":
            y = self.g.slice(x, *arg)
        elif op == "broadcast_to":
            y = self.g.broadcast_to(x, tuple(arg))
        elif op == "reshape":
            y = self.g.reshape(x, tuple(arg))
        elif op in ("reverse", "tile"):
            y = getattr(self.g, op)(x, tuple(arg))
        elif op == "pad":  # zeros: the bound holds
            y = self.g.pad(x, tuple(arg[0]), tuple(arg[1]))
        elif op == "concat":  # the value beside itself
            y = self.g.concat([x, x], arg)
        elif op == "gather":  # [axis, indices]: indices as a constant
            y = self.g.gather(x, self.g.constant(np.array(arg[1], np.int64)), arg[0])
        elif op == "gather_along_axis":  # [axis, indices of the value's rank]: indices as a constant
            y = self.g.gather_along_axis(x, self.g.constant(np.array(arg[1], np.int64)), arg[0])
        elif op == "split":  # [axis, sizes, which piece]
            y = self.g.split(x, list(arg[1]), arg[0])[arg[2]]
        else:
            y = getattr(self.g, op)(x, arg)
        return Value(y, v.bound, v.err, v.exact)

    def _cast(self, i: int, dtype: str) -> Value:
        v, dt = self.values[i], sm.as_dtype(dtype)
        x = v.tensor
        if v.dtype.is_floating and dt.is_integer:  # NaN, infinities and values out of range convert undefined
            lo, hi = (0.0, 100.0) if dt == sm.uint8 else (-100.0, 100.0)
            x = self.g.clamp(self.g.select(self.g.is_finite(x), x, 0.0), lo, hi)
        y = self.g.cast(x, dt)
        if dt.is_bool:
            return Value(y, 1.0, exact=v.exact)
        if dt.is_integer:
            return Value(y, min(v.bound, 100.0) + 1, exact=v.exact)
        return Value(y, v.bound, v.err + self._promotion_error(v, dt), v.exact)

    # elementwise ops
    def _promotion_error(self, v: Value, dt: sm.DType) -> float:
        """The rounding of `v` brought to `dt` (builders insert the cast)."""
        if v.dtype == dt or not dt.is_floating or (v.dtype.is_floating and v.dtype.itemsize < dt.itemsize
                                                   and not (v.dtype == sm.bfloat16 and dt == sm.float16)):
            return 0.0
        return _rounding(dt, v.bound)

    def _guard(self, v: Value, guard: str | None) -> Value:
        x, g = v.tensor, self.g
        if guard == "divisor" and not x.dtype.is_floating:  # integer divisors: at least 1 in magnitude
            y = g.maximum(g.absolute(g.cast(x, sm.int32) if x.dtype.is_bool else x), 1)
            return Value(y, v.bound + 1)
        if guard in ("half", "quarter", "divisor"):
            shift = 0.25 if guard == "quarter" else 0.5
            if not x.dtype.is_floating:
                x = g.cast(x, sm.float32)
            return Value(g.absolute(x) + shift, v.bound + shift, v.err + _rounding(x.dtype, v.bound + shift),
                         v.exact and _rounds_alike(x.dtype))
        if guard in ("tanh", "tanh34"):
            y = g.tanh(x) * (0.75 if guard == "tanh34" else 1.0)
            return Value(y, 1.0, v.err + _rounding(y.dtype, 1.0, 5), exact=False)
        return v

    def _unary(self, name: str, i: int) -> Value:
        v = self.values[i]
        if name in JUMPS:
            y = getattr(self.g, name)(v.tensor)
            return Value(y, 1.0 if y.dtype.is_bool else v.bound + 1.0, exact=v.exact)
        spec = UNARY[name]
        lipschitz, bound, ulps = spec.lipschitz, spec.bound, _ulps(name)
        v = self._guard(v, spec.guards[0])
        y = getattr(self.g, name)(v.tensor)
        exact = v.exact and (spec.exact or spec.rounded and _rounds_alike(y.dtype))
        if not y.dtype.is_floating:
            return Value(y, bound(v.bound), exact=exact)
        err = v.err + self._promotion_error(v, y.dtype)
        return Value(y, bound(v.bound), lipschitz(v.bound) * err + _rounding(y.dtype, bound(v.bound), ulps), exact)

    def _binary(self, name: str, i: int, j: int) -> Value:
        spec = OPS[name].fuzz
        a, b = (self._guard(v, guard) for v, guard in zip((self.values[i], self.values[j]), spec.guards or (None,) * 2))
        y = getattr(self.g, name)(a.tensor, b.tensor)
        both = a.exact and b.exact
        if not y.dtype.is_floating or spec.role == "jump" and name != "modulo":
            return Value(y, 1.0 if y.dtype.is_bool else _int_bound(name, a.bound, b.bound), exact=both)
        ea = a.err + self._promotion_error(a, y.dtype)
        eb = b.err + self._promotion_error(b, y.dtype)
        ba, bb = a.bound, b.bound
        if name == "modulo":  # a - floor(a / b) * b in a kernel, exact in torch; b >= 1/2, so |a / b| <= 2 ba
            return Value(y, bb, ea + (2 * ba + 1) * eb + _rounding(y.dtype, ba + bb, 2), exact=False)
        bound, err = spec.propagate(ba, bb, ea, eb)
        exact = both and (spec.exact or spec.rounded and _rounds_alike(y.dtype))
        return Value(y, bound, err + _rounding(y.dtype, bound, _ulps(name)), exact)

    def _select(self, i: int, j: int, k: int) -> Value:
        p, a, b = self.values[i], self.values[j], self.values[k]
        y = self.g.select(p.tensor, a.tensor, b.tensor)
        err = max(a.err + self._promotion_error(a, y.dtype), b.err + self._promotion_error(b, y.dtype))
        return Value(y, max(a.bound, b.bound), err if y.dtype.is_floating else 0.0, a.exact and b.exact)

    def _clamp(self, i: int, j: int, k: int) -> Value:
        x, lo, hi = self.values[i], self.values[j], self.values[k]
        y = self.g.clamp(x.tensor, lo.tensor, hi.tensor)
        err = max(v.err + self._promotion_error(v, y.dtype) for v in (x, lo, hi))
        return Value(y, max(x.bound, lo.bound, hi.bound), err if y.dtype.is_floating else 0.0,
                     x.exact and lo.exact and hi.exact)

    # reductions and products
    def _reduce(self, name: str, i: int, axes, keep: bool) -> Value:
        v = self.values[i]
        if name in ARG_REDUCTIONS:  # one axis; an index, the same in both runs when the operand is exact
            y = getattr(self.g, name)(v.tensor, axes[0], keep_dims=keep)
            return Value(y, float(v.shape[axes[0]]), exact=v.exact)
        y = getattr(self.g, name)(v.tensor, None if axes is None else tuple(axes), keep_dims=keep)
        n = max(1, v.tensor.type.numel() // max(1, y.type.numel()))
        spec = REDUCTIONS[name]
        if not y.dtype.is_floating:
            return Value(y, spec.propagate(n, v.bound, 0.0, lambda bound, ulps: 0.0)[0], exact=v.exact)
        e = v.err + self._promotion_error(v, y.dtype)
        bound, err = spec.propagate(n, v.bound, e, lambda bound, ulps: _rounding(y.dtype, bound, ulps))
        # Sums run in another order in a kernel: only the extrema keep the bits.
        return Value(y, bound, err, v.exact and spec.exact)

    def _matmul(self, i: int, j: int) -> Value:
        a, b = self.values[i], self.values[j]
        y = self.g.matrix_multiplication(a.tensor, b.tensor)
        k = a.shape[-1]
        ea, eb = a.err + self._promotion_error(a, y.dtype), b.err + self._promotion_error(b, y.dtype)
        bound = k * a.bound * b.bound
        return Value(y, bound, k * (b.bound * ea + a.bound * eb) + _rounding(y.dtype, bound, k + 1), exact=False)


    def _conv(self, i: int, j: int) -> Value:
        """A convolution (NCHW, OIHW, stride 1, no padding): k = C * KH * KW products per output."""
        a, b = self.values[i], self.values[j]
        y = self.g.convolution2d(a.tensor, b.tensor)
        k = b.shape[1] * b.shape[2] * b.shape[3]
        bound = k * a.bound * b.bound
        return Value(y, bound, k * (b.bound * a.err + a.bound * b.err) + _rounding(y.dtype, bound, k + 1), exact=False)


def _int_bound(name: str, a: float, b: float) -> float:
    return {"addition": a + b, "subtraction": a + b, "multiplication": a * b, "floor_division": a + 1,
            "modulo": b}.get(name, max(a, b))


def build(recipe: dict) -> tuple[Replay, list[Value]]:
    replay = Replay(recipe)
    return replay, [replay.values[i] for i in recipe["outputs"]]


def check(recipe: dict) -> None:
    """Compile the recipe's graph for the CPU and compare its run with eager's."""
    replay, outs = build(recipe)
    targets = [v.tensor for v in outs]
    exe = replay.g.compile(replay.feeds, targets, device="cpu")
    got = exe.run(replay.feeds)
    want = replay.g.run(replay.feeds, targets, device="cpu")
    for k, v in enumerate(outs):
        a, b = got[v.tensor].torch(), want[v.tensor].torch()
        where = f"output {k} ({v.tensor.name}: {v.tensor.type}) of {json.dumps(recipe)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if not a.dtype.is_floating_point:
            assert torch.equal(a, b), f"{where}: {a} vs {b}"
            continue
        a, b = a.double(), b.double()
        finite = b.isfinite()
        same_special = (a.isnan() == b.isnan()).all() and torch.equal(a[b.isinf()], b[b.isinf()])
        assert same_special and a[finite].isfinite().all(), f"{where}: NaN or infinities differ:\n{a}\n{b}"
        tol = 0.0 if v.exact else 2 * v.err + ULP[v.dtype] * b[finite].abs() + TINY[v.dtype]
        diff = (a[finite] - b[finite]).abs()
        bound = "bit for bit" if v.exact else f"by up to twice the error bound {v.err:.3g}"
        assert (diff <= tol).all(), f"{where}: differs by {diff.max().item():.3g}; must agree {bound}:\n{a}\n{b}"


# -- drawing recipes ---------------------------------------------------------------------------
@st.composite
def recipes(draw, lane: str) -> dict:
    """A recipe of the lane's input dtypes and mix of steps, valid by construction: each step is
    replayed as it is drawn, so the next one sees the shapes, dtypes, bounds and exactness so far."""
    dtypes, weights = PROFILES[lane]
    kinds = [k for k, w in weights.items() for _ in range(w)]
    steps: list = []
    replay = Replay({"seed": 0, "steps": []})

    def add(step) -> int:
        steps.append(step)
        replay.values.append(replay.apply(step))
        return len(steps) - 1

    def fit(i: int, most: float) -> int:
        """`i`, scaled down by a power of two when its bound passes `most` (floats only)."""
        v = replay.values[i]
        if not v.dtype.is_floating or v.bound <= most:
            return i
        return add(["scale", i, math.ceil(math.log2(v.bound / most))])

    base = draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))

    def new_input(shape=None) -> int:
        dt = draw(st.sampled_from(dtypes))
        if shape is None:  # a suffix of the base shape, some extents 1: inputs broadcast together
            rank = draw(st.integers(0, len(base)))
            shape = [d if draw(st.booleans()) else 1 for d in base[len(base) - rank:]]
        return add(["input", dt.name, list(shape)])

    for _ in range(draw(st.integers(1, 3))):
        new_input()
    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(kinds))
        pool = list(range(len(steps)))
        i = len(steps) - 1 - draw(st.integers(0, len(steps) - 1))  # shrinks toward the latest value: chains
        v = replay.values[i]
        if kind == "unary":
            names = [n for n in UNARY if _accepts(n, v.dtype)]
            name = draw(st.sampled_from(names))
            i = fit(i, UNARY[name].fit[0] or LIMIT)
            add(["unary", name, i])
        elif kind == "binary":
            j = draw(st.sampled_from([k for k in pool if _broadcasts(replay.values[k].shape, v.shape)]))
            name = draw(st.sampled_from([n for n in BINARY if _accepts(n, v.dtype, replay.values[j].dtype)]))
            most = BINARY[name].fit or (LIMIT / 2, LIMIT / 2)
            i, j = fit(i, most[0]), fit(j, most[1])
            if BINARY[name].fit and not replay.values[i].dtype.is_floating \
                    and not replay.values[j].dtype.is_floating:
                name = "maximum"  # ops that fit their operands grow like products: integers could outgrow every bound
            add(["binary", name, i, j])
        elif kind == "jump":
            exact = [k for k in pool if replay.values[k].exact]  # never empty: inputs are exact
            i = draw(st.sampled_from(exact))
            v = replay.values[i]
            which = draw(st.sampled_from(["unary", "binary", "select", "clamp"]))
            if which == "unary":
                names = [n for n in JUMPS if _accepts(n, v.dtype)]
                add(["unary", draw(st.sampled_from(names)), i])
            elif which == "binary":
                j = draw(st.sampled_from([k for k in exact if _broadcasts(replay.values[k].shape, v.shape)]))
                names = [n for n in JUMP_BINARY if _accepts(n, v.dtype, replay.values[j].dtype)]
                add(["binary", draw(st.sampled_from(names)), i, j])
            else:
                others = [k for k in pool if _broadcasts(replay.values[k].shape, v.shape)]
                j = draw(st.sampled_from(others))
                # all three must broadcast together, not only each with the first (never empty: i itself)
                k = draw(st.sampled_from([k for k in others if _broadcasts(replay.values[k].shape,
                                                                            replay.values[j].shape)]))
                if which == "clamp" and any(replay.values[x].dtype.is_bool for x in (i, j, k)):
                    which = "select"
                add([which, i, j, k])
        elif kind == "reduce" and v.shape:
            name = draw(st.sampled_from(list(REDUCTIONS)))
            axes = draw(st.none() | st.lists(st.integers(0, len(v.shape) - 1), min_size=1, unique=True))
            n = math.prod(v.shape) if axes is None else math.prod(v.shape[a] for a in axes)
            if name in ARG_REDUCTIONS:
                if replay.values[i].exact:  # rounding could move an inexact operand's extremum
                    add(["reduce", name, i, [draw(st.integers(0, len(v.shape) - 1))], draw(st.booleans())])
                    continue
                name = "reduction_maximum"
            if name == "reduction_product":
                i = fit(i, min(1.5, LIMIT ** (1.0 / max(n, 1))))
                if not replay.values[i].dtype.is_floating:
                    name = "reduction_maximum"
            else:
                i = fit(i, LIMIT / max(n, 1))
            add(["reduce", name, i, axes, draw(st.booleans())])
        elif kind == "matmul":
            if len(v.shape) < 2:
                i = add(["move", i, "reshape", [1, max(1, math.prod(v.shape))]])
            kdim = replay.values[i].shape[-1]
            j = new_input([kdim, draw(st.integers(1, 4))])
            bound = math.sqrt(LIMIT / kdim)
            add(["matmul", fit(i, bound), fit(j, bound)])
        elif kind == "conv":  # float32 or float64 NCHW; the lane's next steps fuse after it as an epilogue
            if len(v.shape) != 4 or v.dtype not in (sm.float32, sm.float64):
                dt = draw(st.sampled_from([sm.float32, sm.float64]))
                i = add(["input", dt.name, [draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                                            draw(st.integers(3, 6)), draw(st.integers(3, 6))]])
            x = replay.values[i]
            size = draw(st.sampled_from([1, 3]))
            j = add(["input", x.dtype.name, [draw(st.integers(1, 4)), x.shape[1], size, size]])
            if x.shape[2] < size or x.shape[3] < size:
                size, j = 1, add(["input", x.dtype.name, [draw(st.integers(1, 4)), x.shape[1], 1, 1]])
            bound = math.sqrt(LIMIT / (x.shape[1] * size * size))
            add(["conv", fit(i, bound), fit(j, bound)])
        elif kind == "move":
            add(["move", i, *draw(_movement(v.shape))])
        elif kind == "cast":
            target = draw(st.sampled_from([sm.float32, sm.float16, sm.bfloat16, sm.float64, sm.int32, sm.int8,
                                           sm.uint8, sm.bool]))
            if not target.is_floating and not v.exact:  # float to integer or bool jumps
                target = sm.float32
            add(["cast", i, target.name])
    last = len(steps) - 1
    computed = [k for k, s in enumerate(steps) if s[0] != "input" and k != last]
    extra = draw(st.lists(st.sampled_from(computed), max_size=2, unique=True)) if computed else []
    return {"seed": draw(st.integers(0, 2**16)), "specials": draw(st.booleans()), "steps": steps,
            "outputs": sorted(set(extra) | {last})}


_ACCEPTS: dict = {}


def _accepts(name: str, *dts: sm.DType) -> bool:
    """Whether the builder takes operands of these dtypes (a ShapeError says it does not)."""
    key = (name, dts)
    if key not in _ACCEPTS:
        g = sm.Graph()
        try:
            getattr(g, name)(*[g.placeholder((1,), dt) for dt in dts])
            _ACCEPTS[key] = True
        except sm.ShapeError:
            _ACCEPTS[key] = False
    return _ACCEPTS[key]


def _broadcasts(a: tuple, b: tuple) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a), reversed(b)))


# The movement ops the fuzzer can draw arguments for, and the shapes each applies to.
MOVE_APPLIES = {"reshape": lambda shape: True, "expand_dims": lambda shape: True, "broadcast_to": lambda shape: True,
                "transpose": lambda shape: len(shape) > 0, "slice": lambda shape: len(shape) > 0,
                "squeeze": lambda shape: 1 in shape, "reverse": lambda shape: True, "tile": lambda shape: True,
                "pad": lambda shape: len(shape) > 0, "concat": lambda shape: len(shape) > 0,
                "gather": lambda shape: len(shape) > 0, "split": lambda shape: len(shape) > 0,
                "gather_along_axis": lambda shape: len(shape) > 0}


@st.composite
def _movement(draw, shape: tuple) -> list:
    rank = len(shape)
    op = draw(st.sampled_from([op for op in MOVES if MOVE_APPLIES[op](shape)]))
    if op == "reshape":
        n, dims = math.prod(shape), []
        for d in (2, 3, 5):
            while n % d == 0 and draw(st.booleans()):
                dims.append(d)
                n //= d
        return [op, draw(st.permutations(dims + [n]))]
    if op == "expand_dims":
        return [op, draw(st.integers(0, rank))]
    if op == "broadcast_to":
        lead = draw(st.lists(st.integers(1, 3), max_size=1))
        return [op, lead + [d if d != 1 else draw(st.integers(1, 3)) for d in shape]]
    if op == "transpose":
        return [op, draw(st.permutations(range(rank)))]
    if op == "squeeze":
        return [op, [a for a, d in enumerate(shape) if d == 1][:1]]
    if op == "reverse":
        return [op, draw(st.lists(st.integers(0, rank - 1), unique=True)) if rank else []]
    if op == "tile":
        return [op, [draw(st.integers(1, 2)) for _ in shape]]
    if op == "pad":
        return [op, [[draw(st.integers(0, 2)) for _ in shape] for _ in range(2)]]
    if op == "concat":
        return [op, draw(st.integers(0, rank - 1))]
    if op in ("gather", "gather_along_axis", "split"):
        axis = draw(st.integers(0, rank - 1))
        d = shape[axis]
        if op == "gather":  # repeats and any order
            return [op, [axis, draw(st.lists(st.integers(0, d - 1), min_size=1, max_size=4))]]
        if op == "gather_along_axis":  # the value's extents but along `axis`, any index anywhere
            index_shape = [draw(st.integers(1, 3)) if a == axis else e for a, e in enumerate(shape)]
            flat = draw(st.lists(st.integers(0, d - 1), min_size=math.prod(index_shape),
                                 max_size=math.prod(index_shape)))
            return [op, [axis, np.array(flat, np.int64).reshape(index_shape).tolist()]]
        first = draw(st.integers(1, d))
        sizes = [first] + ([d - first] if first < d else [])
        return [op, [axis, sizes, draw(st.integers(0, len(sizes) - 1))]]
    starts, ends, strides = [], [], []
    for d in shape:  # never empty: a backward slice runs from its start down to the first element
        strides.append(draw(st.sampled_from([1, 1, 2, -1])))
        starts.append(draw(st.integers(0, d - 1)))
        ends.append(draw(st.integers(starts[-1] + 1, d)) if strides[-1] > 0 else None)
    return ["slice", [starts, ends, strides]]


# -- the tests ------------------------------------------------------------------------------
@pytest.mark.parametrize("lane", list(PROFILES))
@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzz_compiled_matches_eager(lane, data):
    """150 random graphs per lane, the same ones on every run (derandomized)."""
    recipe = data.draw(recipes(lane))
    note(json.dumps(recipe))
    check(recipe)


def _regressions() -> list:
    return [pytest.param(r, id=f"{path.stem}-{k}") for path in sorted(REGRESSIONS.glob("*.json"))
            for k, r in enumerate(json.loads(path.read_text()))]


@pytest.mark.parametrize("recipe", _regressions())
def test_fuzz_regressions(recipe):
    check(recipe)
