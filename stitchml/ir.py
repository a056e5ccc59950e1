"""The IR's values: tensor types, symbolic tensors and operations.

A `Graph` (graph.py) is a flat, topologically ordered list of `Operation`s in
SSA form. An operation has an op name (a registry key, also the builder's
method name), input tensors, attributes, output tensors and control
dependencies. A `Tensor` is a symbolic value: its `TensorType` (shape with -1
for an unknown dimension, or None for an unknown rank, and a dtype), its
producer and a name. Tensors carry Python operators that build ops on their
graph, so ``0.5 * x * (1.0 + g.erf(x))`` reads as math.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .dtypes import DType, as_dtype
from .errors import GraphError, ShapeError

if TYPE_CHECKING:
    from .graph import Graph

UNKNOWN = -1


@dataclass(frozen=True)
class TensorType:
    """Shape (None: unknown rank; -1: unknown extent) and dtype of a tensor."""

    shape: tuple[int, ...] | None
    dtype: DType

    def __post_init__(self):
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        if self.shape is not None:
            shape = tuple(int(d) for d in self.shape)
            if any(d < -1 for d in shape):
                raise ShapeError(f"shape {shape}: extents must be >= 0, or -1 for unknown")
            object.__setattr__(self, "shape", shape)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and UNKNOWN not in self.shape

    def numel(self) -> int | None:
        if not self.is_static:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n

    def accepts(self, shape: Sequence[int]) -> bool:
        """Whether a concrete shape fits this (possibly partial) type."""
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(d == UNKNOWN or d == s for d, s in zip(self.shape, shape))

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype}[*]"
        return f"{self.dtype}[{','.join('?' if d == UNKNOWN else str(d) for d in self.shape)}]"


class Tensor:
    """A symbolic tensor: one output of one operation of one graph."""

    __slots__ = ("graph", "op", "index", "type", "name", "id", "__weakref__")

    def __init__(self, graph: "Graph", op: "Operation", index: int, type: TensorType, name: str, id: int):
        self.graph = graph
        self.op = op
        self.index = index
        self.type = type
        self.name = name
        self.id = id

    @property
    def shape(self) -> tuple[int, ...] | None:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int | None:
        return self.type.rank

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.type}, op={self.op.op})"

    # Identity equality: tensors are dictionary keys (feeds, results). Use
    # graph.equal(a, b) for the elementwise comparison.
    __hash__ = object.__hash__

    def __bool__(self):
        raise GraphError(
            f"a symbolic tensor ({self.name}) has no truth value while building; use graph.select for data-dependent choices"
        )

    def __iter__(self):
        raise GraphError(f"a symbolic tensor ({self.name}) cannot be iterated; use graph.split or indexing")

    # -- arithmetic --------------------------------------------------------
    def __add__(self, other): return self.graph.addition(self, other)
    def __radd__(self, other): return self.graph.addition(other, self)
    def __sub__(self, other): return self.graph.subtraction(self, other)
    def __rsub__(self, other): return self.graph.subtraction(other, self)
    def __mul__(self, other): return self.graph.multiplication(self, other)
    def __rmul__(self, other): return self.graph.multiplication(other, self)
    def __truediv__(self, other): return self.graph.division(self, other)
    def __rtruediv__(self, other): return self.graph.division(other, self)
    def __floordiv__(self, other): return self.graph.floor_division(self, other)
    def __rfloordiv__(self, other): return self.graph.floor_division(other, self)
    def __mod__(self, other): return self.graph.modulo(self, other)
    def __rmod__(self, other): return self.graph.modulo(other, self)
    def __pow__(self, other): return self.graph.power(self, other)
    def __rpow__(self, other): return self.graph.power(other, self)
    def __matmul__(self, other): return self.graph.matrix_multiplication(self, other)
    def __rmatmul__(self, other): return self.graph.matrix_multiplication(other, self)
    def __neg__(self): return self.graph.negative(self)
    def __pos__(self): return self
    def __abs__(self): return self.graph.absolute(self)
    def __invert__(self): return self.graph.logical_not(self)
    def __and__(self, other): return self.graph.logical_and(self, other)
    def __rand__(self, other): return self.graph.logical_and(other, self)
    def __or__(self, other): return self.graph.logical_or(self, other)
    def __ror__(self, other): return self.graph.logical_or(other, self)
    def __xor__(self, other): return self.graph.logical_xor(self, other)
    def __rxor__(self, other): return self.graph.logical_xor(other, self)
    def __lt__(self, other): return self.graph.less_than(self, other)
    def __le__(self, other): return self.graph.less_than_or_equal_to(self, other)
    def __gt__(self, other): return self.graph.greater_than(self, other)
    def __ge__(self, other): return self.graph.greater_than_or_equal_to(self, other)

    def __getitem__(self, index):
        return self.graph.index(self, index)

    # -- a few conveniences that read well in model code -------------------
    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self.graph.reshape(self, shape)

    def cast(self, dtype):
        return self.graph.cast(self, dtype)

    @property
    def T(self):
        """The last two axes swapped (also for a tensor of unknown rank, checked when it runs)."""
        if self.rank is not None and self.rank < 2:
            raise ShapeError(f"T: tensor {self.name} of type {self.type} has no last two axes to swap")
        return self.graph.transpose(self, -2, -1)


class Operation:
    """One node of the IR. `op` is the registry key; `attrs` are JSON-able."""

    __slots__ = ("graph", "id", "op", "inputs", "attrs", "outputs", "control_deps", "name", "location", "scope")

    def __init__(
        self,
        graph: "Graph",
        id: int,
        op: str,
        inputs: tuple[Tensor, ...],
        attrs: dict[str, Any],
        control_deps: tuple["Operation", ...],
        name: str,
        location: str,
        scope: str,
    ):
        self.graph = graph
        self.id = id
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.outputs: tuple[Tensor, ...] = ()
        self.control_deps = control_deps
        self.name = name
        self.location = location
        self.scope = scope

    @property
    def primitive(self):
        from .registry import lookup

        return lookup(self.op)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Operation({self.name!r}, {self.op})"


def built_at(op: Operation) -> str:
    """How errors name an op: `gather (gather_3, built at train.py:12)`, on every path."""
    return f"{op.op} ({op.name}, built at {op.location})"


def needed_ops(operations: Sequence[Operation], roots: Iterable[Operation],
               control_deps: bool = True) -> list[Operation]:
    """The operations of `operations` that computing `roots` needs, the roots included, in program order.

    The walk follows inputs, and control dependencies unless `control_deps` is False (gradients flow
    along data only), and goes through `operations` only: given the ops appended since some point,
    it looks no further back.

    >>> import stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((2,), sm.float32, name="x")
    >>> y = g.exponent(x); z = g.negative(x)
    >>> [op.op for op in needed_ops(g.operations, [y.op])]
    ['placeholder', 'exponent']
    """
    among = {op.id for op in operations}
    needed: set[int] = set()
    stack = [op for op in roots if op.id in among]
    while stack:
        op = stack.pop()
        if op.id in needed:
            continue
        needed.add(op.id)
        stack.extend(t.op for t in op.inputs if t.op.id in among)
        if control_deps:
            stack.extend(d for d in op.control_deps if d.id in among)
    return [op for op in operations if op.id in needed]


def broadcast_shapes(*shapes: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """NumPy broadcasting over partial shapes; raises ShapeError with the reason."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        known = {d for d in dims if d not in (1, UNKNOWN)}
        if len(known) > 1:
            raise ShapeError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast (axis {axis - rank})")
        if known:
            out.append(known.pop())
        elif UNKNOWN in dims:
            out.append(UNKNOWN)
        else:
            out.append(1)
    return tuple(out)


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1) or (rank == 0 and axis not in (0, -1)):
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes, rank: int | None) -> tuple[int, ...] | None:
    """axes=None means all; negative axes count from the end; no repeats."""
    if axes is None:
        return None if rank is None else tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    axes = tuple(int(a) for a in axes)
    if rank is None:
        return axes
    out = tuple(sorted(normalize_axis(a, rank) for a in axes))
    if len(set(out)) != len(out):
        raise ShapeError(f"axes {axes} name an axis twice")
    return out
