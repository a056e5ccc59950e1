"""The op registry: every primitive is defined once, here-by-registration.

A `Primitive` holds everything the rest of the system needs to know about an
op: its kind, the shape-and-dtype rule, the reference implementation in torch
(any device), its gradient rule (or a mark that it has none), and what the
compiler may do with it: for elementwise ops the Triton expression the code
generator stitches together, for fusable reductions their `Combine`, for
views the rule that derives the output's strided layout from the input's,
for contractions the kernel template (and vendor call) they start.
The builder method on `Graph` carries the same name as the primitive, so IR
dumps, error messages and docs share one vocabulary.

Op modules define a primitive in one block, JAX style::

    exponent = unary("exponent", torch.exp, "tl.exp({0})", float_only=True)

    @exponent.def_vjp
    def _(g, op, dy):
        return [dy * op.outputs[0]]

Everything else (interpreter, autodiff, fuser, codegen, importers, tests)
looks entries up here; nobody branches on op names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Op kinds: what the compiler may do with an op.
ELEMENTWISE = "elementwise"  # out[i] = f(in_1[i], ...) after broadcasting
REDUCTION = "reduction"  # folds some axes of one input
MOVEMENT = "movement"  # reorders or selects elements (views, gathers, pads)
CONTRACTION = "contraction"  # matmul, convolution: vendor kernels
OPAQUE = "opaque"  # anything else with a reference implementation
RANDOM = "random"  # draws from a seeded generator
STATE = "state"  # placeholders, constants, variables and their reads/writes
KINDS = (ELEMENTWISE, REDUCTION, MOVEMENT, CONTRACTION, OPAQUE, RANDOM, STATE)


@dataclass(frozen=True)
class Combine:
    """How a reduction folds in generated kernels, as Triton text.

    `neutral` is the identity element ("INF" / "-INF" become the dtype's
    extremes in codegen/reduction.py), `combine` joins two partial values
    {a} and {b}, `finish` folds a tile {x} along axis 1, and `mean` divides
    the folded value by the number of reduced elements.
    """

    neutral: str
    combine: str
    finish: str
    mean: bool = False


@dataclass
class Primitive:
    """One operation. See the module docstring for how entries are written."""

    name: str
    kind: str
    infer: Callable[..., Any] | None = None  # (in_types: list[TensorType], **attrs) -> TensorType | list
    impl: Callable[..., Any] | None = None  # (*torch_inputs, **attrs) -> torch.Tensor | tuple
    needs_context: bool = False  # impl takes a RunContext first (state, random)
    vjp: Callable[..., Any] | None = None  # (graph, op, *cotangents) -> list[Tensor | None]
    differentiable: bool = True  # False: no gradient flows through, on purpose
    # elementwise: expression over {0}, {1}, ... in float32 or the input type; or a dict of them keyed by
    # the first operand's dtype name or "float" / "int" (codegen/common.py: triton_template)
    triton: str | dict | None = None
    float_only: bool = False  # elementwise: integer inputs are promoted to float32 first
    # reduction: how a reduction kernel folds it; None: it runs alone through its reference implementation
    combine: Combine | None = None
    # reduction: no value over zero elements (a maximum, an arg-minimum): compile refuses an empty axis
    needs_elements: bool = False
    # movement: (base, out_shape, attrs) -> the output as a view of `base`, a strided meta tensor laid out like
    # the input's buffer; None (or a RuntimeError) when it must copy. Views alias their input (passes/memory.py)
    view: Callable[..., Any] | None = None
    template: str | None = None  # contraction: the kernel template it starts, its epilogue fused after it
    # contraction: the vendor library call, (out, *inputs, **attrs) -> result: it writes into the planned buffer
    # `out` and returns it, or returns the library's own memory (then `out` is unused)
    vendor: Callable[..., Any] | None = None
    doc: str = ""
    # How the reference computes on uint64, which PyTorch lacks most kernels for: "ring", "order" or "value"
    # (ops/widen.py says what each means; empty: widen.default_class picks by name and kind)
    unsigned: str = ""

    def __post_init__(self):
        if not self.unsigned:
            from .ops.widen import default_class

            self.unsigned = default_class(self.name, self.kind)

    def __setattr__(self, key, value):
        # Every implementation computes on uint16/32/64 and float8 operands, widened where torch cannot.
        if key == "impl" and value is not None:
            from .ops.widen import widening

            value = widening(self, value)
        object.__setattr__(self, key, value)

    def def_infer(self, fn):
        self.infer = fn
        return fn

    def def_impl(self, fn=None, *, needs_context: bool = False):
        def register(f):
            self.impl = f
            self.needs_context = needs_context
            return f

        return register(fn) if fn is not None else register

    def def_vjp(self, fn):
        self.vjp = fn
        return fn

    def def_view(self, fn):
        self.view = fn
        return fn

    def def_vendor(self, fn):
        self.vendor = fn
        return fn

    def __repr__(self) -> str:
        return f"Primitive({self.name!r}, {self.kind})"


REGISTRY: dict[str, Primitive] = {}


def register(prim: Primitive) -> Primitive:
    if prim.kind not in KINDS:
        raise ValueError(f"primitive {prim.name!r}: unknown kind {prim.kind!r}; expected one of {KINDS}")
    if prim.name in REGISTRY:
        raise ValueError(f"primitive {prim.name!r} is defined twice")
    REGISTRY[prim.name] = prim
    return prim


def lookup(name: str) -> Primitive:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; it is not in the registry") from None


# Builder methods (primitives and composites) are attached to Graph by name.
BUILDERS: dict[str, Callable[..., Any]] = {}
COMPOSITES: set[str] = set()


def builder(name: str | None = None, *, composite: bool = False):
    """Register `fn(graph, ...)` as the Graph method `name` (default: fn's name)."""

    def register_builder(fn):
        key = name or fn.__name__
        if key in BUILDERS:
            raise ValueError(f"builder {key!r} is defined twice")
        BUILDERS[key] = fn
        if composite:
            COMPOSITES.add(key)
        return fn

    return register_builder
