"""The op database's building blocks: records, samples, error inputs, known failures.

An `OpInfo` describes one builder method (a primitive or a composite) the way
PyTorch's OpInfo and Thunder's opinfos do: how to call it (`build`), sample
inputs per dtype, a reference written without StitchML (PyTorch or NumPy, in
float64 for floating inputs), the dtypes it supports, inputs that must fail
and how, whether it is differentiable, its op family for the tolerance rule
(tests/tolerance.py), and the known failures that must stay listed until
fixed. The generic tests (test_ops.py, test_gradients.py, test_serialize.py)
run every record through the same templates, so a new op is one record.
"""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

import stitchml as sm
from stitchml.dtypes import DType
from stitchml.registry import COMPOSITES, CONTRACTION, ELEMENTWISE, MOVEMENT, OPAQUE, REDUCTION, REGISTRY, STATE
from tolerance import FAMILIES, assert_within, sensitivity

FLOATS: tuple[DType, ...] = (sm.float16, sm.bfloat16, sm.float32, sm.float64)
INTS: tuple[DType, ...] = (sm.int8, sm.uint8, sm.int16, sm.int32, sm.int64)
NUMERIC: tuple[DType, ...] = FLOATS + INTS
ALL: tuple[DType, ...] = NUMERIC + (sm.bool,)

# The tolerance rule's family of a record by its primitive's kind (records of math-library
# functions say "transcendental"; composites are "composite").
KIND_FAMILY = {ELEMENTWISE: "elementwise", MOVEMENT: "elementwise", STATE: "elementwise", REDUCTION: "reduction",
               CONTRACTION: "contraction", OPAQUE: "contraction"}


@dataclass
class Sample:
    """One call of an op: tensor `args` (fed through placeholders), keyword `kwargs`.

    `more` holds further tuples of args (same ranks and dtypes, other sizes)
    fed to the same graph in later runs when its placeholders have -1 extents.
    `dynamic` overrides the placeholder shapes of the dynamic variant (default:
    every extent -1; False: the builder needs every extent). `unranked=False`
    keeps it out of the unknown-rank variant (its builder needs the rank).
    `grad=False` keeps it out of gradient checks (a kink, a tie, a pole).
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    name: str = ""
    more: tuple = ()
    dynamic: tuple | bool | None = None
    unranked: bool = True
    grad: bool = True

    def describe(self) -> str:
        shapes = ", ".join(f"{tuple(a.shape)}" for a in self.args)
        return f"{self.name or 'sample'}[{shapes}]{self.kwargs if self.kwargs else ''}"


@dataclass
class P:
    """A placeholder of an error input: its declared shape and dtype."""

    shape: tuple | None
    dtype: DType = sm.float32


@dataclass
class ErrorInput:
    """Arguments that must fail with `error` whose message holds `match`.

    Without `feeds` the error comes while building; with them the graph must
    build and the run must fail. `op` is the op the message must name (default:
    the record's name); `build` replaces the record's.
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    error: type = sm.ShapeError
    match: str = ""
    feeds: tuple | None = None
    op: str | None = None
    build: Callable | None = None
    name: str = ""


@dataclass(frozen=True)
class KnownFailure:
    """A check that fails today, for `reason`; matched by test, dtype and sample name.

    A known failure is strict: when the check starts to pass, the test fails
    and asks for the entry to be removed.
    """

    test: str  # "reference", "types", "errors", "gradient", "second_order", "serialize"
    reason: str
    dtypes: tuple = ()  # empty: every dtype
    sample: str = ""  # substring of the sample name; empty: every sample


def _same(dtype: DType, kwargs: dict) -> DType:
    return dtype


def to_float(dtype: DType, kwargs: dict) -> DType:
    """The result dtype of ops defined only on floats: integers and bool become float32."""
    return dtype if dtype.is_floating else sm.float32


def to_bool(dtype: DType, kwargs: dict) -> DType:
    """The result dtype of comparisons and predicates."""
    return sm.bool


@dataclass(frozen=True)
class Fuzz:
    """How the compiler fuzzer (tests/test_fuzz_compiler.py) draws an op, and how its error grows.

    `role`: "unary" and "binary" (smooth ops, carried with an error bound), "jump" (takes only operands
    both runs hold bit for bit, and gives such results: rounding, sign, predicates, comparisons, logic,
    integer division), "reduction", "move" (a movement op; its arguments are the fuzzer's to draw),
    "matmul", "conv", "cast", "select", "clamp".
    `fit`: per operand, the largest magnitude it may have before the op (the fuzzer scales it down by a
    power of two first; None: the fuzzer's default). `guards`: per operand, a guard the graph applies
    to move it where the op is defined and smooth: "half" |x| + 1/2, "quarter" |x| + 1/4, "tanh",
    "tanh34" 3/4 tanh(x), "divisor" (floats: "half"; integers: at least 1 in magnitude).
    Unary: `lipschitz(b)` and `bound(b)` on operands bounded by b. Binary: `propagate(ba, bb, ea, eb)` ->
    (bound, err) from the operands' bounds and errors. Reduction: `propagate(n, b, e, rounding)` ->
    (bound, err) over n elements, `rounding(bound, ulps)` the fuzzer's rounding error.
    `exact`: the op does not round; `rounded`: one correctly rounded operation (the same bits in both
    runs where they round alike); otherwise the op rounds by its family's units (tests/tolerance.py).
    """

    role: str
    fit: tuple = ()
    guards: tuple = ()
    lipschitz: Callable[[float], float] | None = None
    bound: Callable[[float], float] | None = None
    propagate: Callable[..., tuple] | None = None
    exact: bool = False
    rounded: bool = False

    def __post_init__(self):
        if self.role not in FUZZ_ROLES:
            raise ValueError(f"unknown fuzz role {self.role!r}; one of {', '.join(FUZZ_ROLES)}")


FUZZ_ROLES = ("unary", "binary", "jump", "reduction", "move", "matmul", "conv", "cast", "select", "clamp")


@dataclass
class OpInfo:
    """One builder method and everything the generic tests need to check it."""

    name: str
    samples: Callable[["OpInfo", DType, np.random.Generator], Iterable[Sample]]
    ref: Callable[..., Any] | None  # torch tensors in (float64 where floating) -> tensor(s)
    dtypes: tuple[DType, ...]
    build: Callable[..., Any] | None = None  # (graph, *tensors, **kwargs) -> Tensor | sequence; default g.<name>
    check: Callable[..., None] | None = None  # for ops with no value reference (random): (result, *args, **kw)
    # (sample dtype, kwargs) -> the dtype of every result, or a tuple of one dtype per result
    out_dtype: Callable[[DType, dict], DType | tuple[DType, ...]] = _same
    float_only: bool | None = None  # integer args go to the reference as float64 (default: the registry's)
    errors: Callable[[], Iterable[ErrorInput]] = lambda: ()
    differentiable: bool | None = None  # default: the registry's flag (composites: True)
    second_order: bool = False
    inputs: str = "placeholder"  # or "variable": tensor args become variables
    dynamic: bool = True  # the -1-extent variant builds (else needs known extents: see errors)
    unranked: bool = True  # the unknown-rank variant builds
    family: str = ""  # the op family of the tolerance rule (tests/tolerance.py); default from the registry's kind
    grad_tol: tuple[float, float] = (1e-7, 1e-9)
    known_failures: tuple[KnownFailure, ...] = ()
    equivalent: str = ""  # NumPy / PyTorch equivalent, for docs/ops.md
    builder: bool = True  # False: a primitive only gradients emit (no Graph method)
    # Per operand, the [low, high) that value tests (the compiled sample graphs) draw from where the
    # default (-3, 3) leaves the op's mathematical domain; each range lies inside that domain and reaches
    # toward its edges. Gradient samples may stay further inside (see `samples`).
    domains: tuple[tuple[float, float], ...] = ()
    nonzero: int | None = None  # the operand that must not be zero (a divisor)
    fuzz: Fuzz | None = None  # how the compiler fuzzer draws the op; None: see opdb/coverage.py
    # One correctly rounded (or exact) operation, in a kernel as in PyTorch: compiled equals eager bit for bit.
    # (Not square_root: PyTorch's float64 sqrt on the CPU is not correctly rounded, sqrt(0.5) for one.)
    bit_exact: bool = False

    def __post_init__(self):
        prim = REGISTRY.get(self.name)
        if self.float_only is None:
            self.float_only = bool(prim and prim.float_only)
        if self.differentiable is None:
            self.differentiable = prim.differentiable if prim else True
        if not self.family:
            self.family = "composite" if self.name in COMPOSITES else KIND_FAMILY.get(prim.kind if prim else "",
                                                                                    "elementwise")
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown op family {self.family!r}; one of {', '.join(FAMILIES)}")

    def call(self, g: sm.Graph, tensors: Sequence[sm.Tensor], kwargs: dict) -> list[sm.Tensor]:
        """Build the op on `tensors`; always a list of output tensors."""
        if self.build is not None:
            out = self.build(g, *tensors, **kwargs)
        else:
            out = getattr(g, self.name)(*tensors, **kwargs)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def rng(self, dtype: DType) -> np.random.Generator:
        """A generator seeded by (op, dtype): every run of the suite sees the same inputs."""
        return np.random.default_rng(zlib.crc32(f"{self.name}/{dtype}".encode()))

    def samples_for(self, dtype: DType) -> list[Sample]:
        return list(self.samples(self, dtype, self.rng(dtype)))

    def known_failure(self, test: str, dtype: DType | None, sample: str = "") -> KnownFailure | None:
        for kf in self.known_failures:
            if kf.test == test and (not kf.dtypes or dtype in kf.dtypes) and kf.sample in sample:
                return kf
        return None


@contextlib.contextmanager
def expected(kf: KnownFailure | None, what: str) -> Iterator[None]:
    """Run a check; under a known failure it must fail, and passing is an error."""
    if kf is None:
        yield
        return
    try:
        yield
    except Exception:
        return
    raise AssertionError(f"{what} is listed as a known failure ({kf.reason}) but passes now: remove the entry")


# -- making inputs ----------------------------------------------------------------
def make(shape: Sequence[int], dtype: DType, rng: np.random.Generator, low: float = -3.0, high: float = 3.0,
         layout: str = "contiguous", values: Sequence | None = None) -> torch.Tensor:
    """A torch tensor of `dtype` and `shape` with values in [low, high).

    `layout` "transposed" gives a non-contiguous permuted view, "sliced" a view
    taking every other element of a larger last axis, from an offset of one.
    `values` draws from a fixed set instead (ties, exact integers, specials).
    """
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        base = make(shape[::-1], dtype, rng, low, high, values=values)
        return base.permute(*reversed(range(len(shape))))
    if layout == "sliced" and shape:
        base = make(shape[:-1] + (2 * shape[-1] + 1,), dtype, rng, low, high, values=values)
        return base[..., 1::2]
    if values is not None:
        pool = np.asarray(values, dtype=np.float64)
        data = rng.choice(pool[pool >= 0] if not dtype.is_signed else pool, size=shape)
    elif dtype.is_bool:
        data = rng.random(shape) < 0.5
    elif dtype.is_integer:
        info = torch.iinfo(dtype.torch)
        lo, hi = max(int(np.floor(low)), info.min), min(int(np.ceil(high)), info.max)
        data = rng.integers(lo, hi, size=shape, endpoint=True)
    else:
        data = rng.uniform(low, high, size=shape)
    return torch.as_tensor(np.asarray(data)).to(dtype.torch)


def exact(values: Sequence, dtype: DType) -> torch.Tensor:
    """A 1-D tensor of exactly these values (write only values `dtype` can hold)."""
    return torch.tensor(list(values), dtype=torch.float64).to(dtype.torch)


def vjp(fn: Callable[[torch.Tensor], torch.Tensor], at: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    """The gradient of `fn` at `at` applied to `cotangent`, by torch autograd, itself differentiable.

    References of gradient primitives are written this way: their definition,
    not a re-derivation of our rules.
    """
    with torch.enable_grad():
        x = at if at.requires_grad else at.detach().requires_grad_(True)
        (out,) = torch.autograd.grad(fn(x), x, cotangent, create_graph=True)
    return out


def adjoint(fn: Callable[[torch.Tensor], torch.Tensor], like: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    """The adjoint of the linear map `fn` (from tensors shaped like `like`) applied to `cotangent`.

    Computed in float64 (integer cotangents too) and cast back to the cotangent's dtype.
    """
    z = torch.zeros(like.shape, dtype=torch.float64)
    return vjp(fn, z, cotangent.to(torch.float64)).to(cotangent.dtype)


def ref_args(record: OpInfo, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The reference's view of the args: floats as float64, and integers too for float-only ops.

    Not detached: the tolerance rule differentiates the reference through them (tests/tolerance.py).
    """
    return [a.to(torch.float64) if a.dtype.is_floating_point or record.float_only else a for a in args]


def as_outputs(value: Any) -> list[torch.Tensor]:
    """A reference's result as a list of torch tensors."""
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in as_outputs(v)]
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return [torch.as_tensor(np.asarray(value))]
    return [value]


_SCALES: dict[tuple, tuple] = {}  # (record, ids of the args, kwargs) -> (the args, kept alive, and their scales)


def _scales(record: OpInfo, args: Sequence[torch.Tensor], inputs: list[torch.Tensor], kwargs: dict) -> list:
    """`tolerance.sensitivity` of the record's reference, once per sample: the static, dynamic and unranked
    variants feed the same args."""
    key = (record.name, tuple(id(a) for a in args), repr(kwargs))
    if key not in _SCALES:
        if len(_SCALES) >= 16:
            _SCALES.pop(next(iter(_SCALES)))
        _SCALES[key] = (args, sensitivity(lambda *xs: record.ref(*xs, **kwargs), inputs))
    return _SCALES[key][1]


def assert_reference(record: OpInfo, got: Sequence[torch.Tensor], args: Sequence[torch.Tensor], kwargs: dict,
                     what: str) -> None:
    """The results `got` of the record's op on `args` obey the tolerance rule against its float64 reference."""
    inputs = ref_args(record, args)
    want = as_outputs(record.ref(*inputs, **kwargs))
    assert len(got) == len(want), f"{what}: {len(got)} outputs, reference has {len(want)}"
    scales = _scales(record, args, inputs, kwargs) if any(a.is_floating_point() for a in got) else []
    for i, (a, b) in enumerate(zip(got, want)):
        scale = scales[i] if i < len(scales) else None
        if scale is not None and tuple(scale[0].shape) != tuple(a.shape):
            scale = None
        assert_within(a, b, record.family, f"{what} output {i}", scale)
