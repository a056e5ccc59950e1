"""Functions specialised at run time on the values (or extents) of some inputs.

An ONNX model may compute an operand the IR needs as a constant (a Reshape's
shape, Reduce axes, Slice starts, Resize scales, Pad pads, Range's bounds,
OneHot's depth...) from its graph inputs. Such an operand decides the graph
itself, not just the data flowing through it, so the importer cannot build one
graph for every value. Instead `from_onnx` returns a `SpecializedFunction`:
its signature is the model's, and a call imports the model again with those
inputs *bound* to the values fed (everything computed from them folds to
constants), once per distinct value, in a bounded cache. The graph of one
specialisation is static and compiled per input signature as any other, so
the compiled path never sees a run-time shape operand.

The same holds for extents: a shape computation from ``Shape(x)`` that the
importer cannot follow symbolically (onnx_values.py's `Dims`) is imported
with the inputs' extents fixed to those fed, so the arithmetic folds per
input shape.

Each specialisation is logged, like a recompile, with what was new:
``specialised 'main' for new values of its run-time operands (shape: [2, 3] -> [3, 2])``.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import FeedError, PackageError
from ..tensor_data import TensorData
from .package import Function, Port

log = logging.getLogger("stitchml.package")
CACHE_SIZE = 16  # specialisations kept per function, least recently used dropped first
MAX_VALUE_ELEMENTS = 4096  # an input a specialisation is keyed on holds at most this many elements


def _show(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], str):  # (dtype, shape, bytes)
        dt, shape, raw = value
        arr = np.frombuffer(raw, dtype=dt).reshape(shape)
        text = np.array2string(arr, threshold=8, separator=", ")
        return text.replace("\n", "")
    return str(list(value))


class SpecializedFunction(Function):
    """A package function whose graph depends on the values (or extents) of some of its inputs.

    Call it as any `Function`; `specialise(**inputs)` returns the plain `Function` for given inputs
    (which a package can save). `value_inputs` names the inputs whose values select the graph;
    `shape_specialised` says whether every input's extents do too.
    """

    def __init__(self, name: str, model, importer_args: dict, inputs: list[Port], outputs: list[Port],
                 value_inputs: tuple[str, ...], shapes: bool, import_graph, import_time_error: type[Exception]):
        super().__init__(name, None, {p.name: (None, p) for p in inputs}, {p.name: (None, p) for p in outputs})
        self._model = model
        self._importer_args = importer_args
        # The importer's entry and its "operand known only at run time" error (onnx_import.py, which makes
        # this function: passed in, so that the two modules do not import each other).
        self._import_graph, self._import_time_error = import_graph, import_time_error
        self.value_inputs = tuple(value_inputs)
        self.shape_specialised = shapes
        self._cache: OrderedDict[tuple, Function] = OrderedDict()
        self.specialise_log: list[str] = []

    @property
    def graph(self):
        raise PackageError(f"function {self.name!r} has no single graph: its graph depends on the "
                           f"{self._what()} at run time; fn.specialise(**inputs) gives the graph for some inputs")

    @graph.setter
    def graph(self, value) -> None:  # Function.__init__ assigns it; a specialised function has none
        if value is not None:
            raise PackageError(f"function {self.name!r} is specialised at run time and takes no graph")

    def _what(self) -> str:
        parts = []
        if self.value_inputs:
            parts.append(f"values of input{'s' if len(self.value_inputs) > 1 else ''} "
                         f"{', '.join(self.value_inputs)}")
        if self.shape_specialised:
            parts.append("extents of its inputs")
        return " and ".join(parts)

    def _key(self, data: dict[str, TensorData]) -> tuple:
        values = []
        for n in self.value_inputs:
            arr = data[n].numpy()
            if arr.size > MAX_VALUE_ELEMENTS:
                raise FeedError(f"function {self.name!r}: input {n} selects the graph by its value, so it may "
                                f"hold at most {MAX_VALUE_ELEMENTS} elements; got {arr.size}")
            arr = np.ascontiguousarray(arr)
            values.append((arr.dtype.str, arr.shape, arr.tobytes()))
        shapes = tuple(tuple(d.shape) for d in data.values()) if self.shape_specialised else ()
        return tuple(values), shapes

    def _describe(self, key: tuple) -> str:
        if not self._cache:
            return "first run"
        old = next(reversed(self._cache))
        for n, a, b in zip(self.value_inputs, old[0], key[0]):
            if a != b:
                return f"{n}: {_show(a)} -> {_show(b)}"
        for n, a, b in zip(self._inputs, old[1], key[1]):
            if a != b:
                return f"extents of {n}: {list(a)} -> {list(b)}"
        return "a new run-time operand"

    def specialise(self, **inputs: Any) -> Function:
        """The plain function (one static graph) for these inputs' values and extents."""
        data = self.check_inputs(inputs)
        while True:
            key = self._key(data)
            fn = self._cache.get(key)
            if fn is not None:
                self._cache.move_to_end(key)
                return fn
            bind = {n: data[n].numpy() for n in self.value_inputs}
            shapes = {n: tuple(d.shape) for n, d in data.items()} if self.shape_specialised else None
            try:
                fn = self._import_graph(self._model, self.name, bind=bind, shapes=shapes, **self._importer_args)
            except self._import_time_error as e:
                # A second run-time operand, reached once the first is known: key on it too, then retry.
                new = [n for n in e.inputs if n in data and n not in self.value_inputs]
                if e.shapes and not self.shape_specialised:
                    self.shape_specialised = True
                elif new:
                    self.value_inputs += tuple(new)
                else:
                    raise
                self._cache.clear()
                continue
            message = f"specialised {self.name!r} for new {self._what()} ({self._describe(key)}): " \
                      f"{len(fn.graph.operations)} operations"
            self.specialise_log.append(message)
            log.info(message)
            self._cache[key] = fn
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return fn

    def __call__(self, **inputs: Any) -> dict[str, TensorData]:
        fn = self.specialise(**inputs)
        data = self.check_inputs(inputs)
        return fn(**{n: d for n, d in data.items() if n in {p.name for p in fn.inputs}})

    @property
    def compile_log(self) -> list[str]:
        """The specialisations made, then each specialisation's compiles (`Graph.compile_log`)."""
        return self.specialise_log + [line for fn in self._cache.values() for line in fn.graph.compile_log]

    def op_counts(self) -> dict[str, int]:
        raise PackageError(f"function {self.name!r}: op counts depend on the {self._what()}; "
                           "count those of fn.specialise(**inputs)")

    def weight_bytes(self) -> int:
        return 0

    def __repr__(self) -> str:
        return (f"SpecializedFunction({self.name!r}, ({', '.join(str(p) for p in self.inputs)}) -> "
                f"({', '.join(str(p) for p in self.outputs)}), specialised on the {self._what()})")

