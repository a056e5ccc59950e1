"""Graph: the container of the IR and the entry point of the builder API.

Building appends operations in program order, so the list is always
topologically sorted. The builder methods (`g.exponent`, `g.reduction_sum`,
`g.softmax`...) are not written here: each op module registers its own, and
they are attached to `Graph` when the package is imported (see registry.py).

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph()
    >>> x = g.placeholder((-1, 2), sm.float32, name="x")
    >>> y = g.exponent(x) + 1.0
    >>> g.run({x: np.zeros((3, 2), np.float32)}, targets=[y], device="cpu")[y].numpy().tolist()
    [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
"""
from __future__ import annotations

import contextlib
import inspect
import os
import threading
from typing import Any, Iterable, Sequence

import torch

from . import dtypes
from .dtypes import DType
from .errors import GraphError, ShapeError
from .ir import Operation, Tensor, TensorType
from .registry import RANDOM, STATE, lookup

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_location() -> str:
    """file:line of the first frame outside this package: the user's code that built the op."""
    frame = inspect.currentframe()
    while frame is not None:
        path = frame.f_code.co_filename
        if not os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "<stitchml>"


class Graph:
    """A graph of tensors and operations (MPSGraph's model); see the module docstring."""

    def __init__(self, name: str = "graph", parent: "Graph | None" = None):
        self.name = name
        # A sub-graph (a control-flow body) reads its parent's tensors through placeholders: `captures`
        # lists the outer tensors in the order their placeholders were made (see `_capture`).
        self.parent = parent
        self.captures: list[Tensor] = []
        self._captured: dict[int, Tensor] = {}
        self._inner: Graph | None = None  # the body being built: builder calls on this graph go there
        self.operations: list[Operation] = []
        self._next_op = 0
        self._next_tensor = 0
        self._control_stack: list[tuple[Operation, ...]] = []
        self._scope_stack: list[str] = []
        # Variable values live here between runs: variable op id -> torch tensor on its device.
        self._variable_values: dict[int, torch.Tensor] = {}
        self._constant_cache: dict[tuple[int, str], torch.Tensor] = {}
        # One lock for everything that reads or writes the variables or run_count: eager runs, every
        # executable's runs and replays, bound runs and pipelines made from this graph (docs/semantics.md).
        self._run_lock = threading.RLock()
        self._build_lock = threading.Lock()  # ids and the operation list, for builders on several threads
        self.run_count = 0  # runs so far; random ops draw from (seed, run_count)
        self._fold_constants = False  # set while building gradients (autodiff.py)
        self._executables = None  # compiled executables by signature, made by the first compiled run
        self.buckets: dict | None = None  # default shape buckets of compiled runs: {placeholder: {axis: rule}}

    # -- building ------------------------------------------------------------
    def _emit(
        self,
        op: str,
        inputs: Sequence[Tensor],
        attrs: dict[str, Any] | None = None,
        name: str | None = None,
        *,
        types: Sequence[TensorType] | None = None,
    ) -> Operation:
        """Append one operation, inferring its output types through the registry."""
        if self._inner is not None:  # a control-flow body is being built: `g.tanh(x)` in it lands there
            return self._inner._emit(op, inputs, attrs, name, types=types)
        return self._append(op, inputs, attrs, name, types)

    def _append(self, op: str, inputs: Sequence[Tensor], attrs: dict[str, Any] | None, name: str | None,
                types: Sequence[TensorType] | None) -> Operation:
        prim = lookup(op)
        attrs = dict(attrs or {})
        for t in inputs:
            if not isinstance(t, Tensor):
                raise GraphError(f"{op}: expected a Tensor input, got {type(t).__name__}")
        inputs = [t if t.graph is self else self._capture(t, op) for t in inputs]
        for t in inputs:
            if t.op.attrs.get("asynchronous") and op != "collective_wait":
                # an asynchronous collective's buffer is still being written: only its wait may read it
                raise GraphError(f"{op}: input {t.name} is an asynchronous {t.op.op}; pass it through "
                                 f"collective_wait first")
        location = _user_location()
        if types is None:
            try:
                out = prim.infer([t.type for t in inputs], **attrs)
            except ShapeError as e:
                described = ", ".join(f"{t.name}: {t.type}" for t in inputs) or "none"
                raise ShapeError(f"{op}: {e}; inputs: {described}; built at {location}") from None
            types = [out] if isinstance(out, TensorType) else list(out)
        if self._fold_constants and len(types) == 1 and self._foldable(prim, inputs, types[0]):
            return self._fold(prim, inputs, attrs, name)
        deps = tuple(dict.fromkeys(d for group in self._control_stack for d in group))
        scope = "/".join(self._scope_stack)
        with self._build_lock:
            operation = Operation(self, self._next_op, op, tuple(inputs), attrs, deps, "", location, scope)
            self._next_op += 1
            operation.name = name or f"{op}_{operation.id}"
            outputs = []
            for i, tt in enumerate(types):
                tname = operation.name if len(types) == 1 else f"{operation.name}:{i}"
                outputs.append(Tensor(self, operation, i, tt, tname, self._next_tensor))
                self._next_tensor += 1
            operation.outputs = tuple(outputs)
            self.operations.append(operation)
        return operation

    _FOLD_LIMIT = 4096  # elements: larger results stay ops, so folding never bloats the IR

    def _foldable(self, prim, inputs, out_type) -> bool:
        return (bool(inputs) and prim.kind not in (STATE, RANDOM) and not prim.needs_context
                and all(t.op.op == "constant" for t in inputs)
                and out_type.is_static and out_type.numel() <= self._FOLD_LIMIT)

    def _fold(self, prim, inputs, attrs, name) -> Operation:
        """Evaluate an op of constants now and emit its value as a constant."""
        value = prim.impl(*[t.op.attrs["value"] for t in inputs], **attrs)
        self._fold_constants = False
        try:
            return self._emit("constant", [], {"value": value.detach().cpu().contiguous().clone()}, name)
        finally:
            self._fold_constants = True

    def _emit1(self, op: str, inputs: Sequence[Tensor], attrs: dict | None = None, name: str | None = None) -> Tensor:
        return self._emit(op, inputs, attrs, name).outputs[0]

    def as_tensor(self, value: Any, like: DType | None = None) -> Tensor:
        """A Tensor as is; a Python scalar as a weakly typed constant (dtypes.py); arrays as constants."""
        if isinstance(value, Tensor):
            here = self.innermost()
            return value if value.graph is here else here._capture(value, "as_tensor")
        if isinstance(value, (bool, int, float)):
            return self.constant(value, dtypes.scalar_dtype(value, like))
        return self.constant(value)

    def innermost(self) -> "Graph":
        """The graph builder calls land in: this one, or the control-flow body being built inside it."""
        g = self
        while g._inner is not None:
            g = g._inner
        return g

    @contextlib.contextmanager
    def building(self, body: "Graph"):
        """Builder calls on this graph (and graphs around it) go to `body`, a sub-graph of it, inside."""
        here = self.innermost()
        if body.parent is not here:
            raise GraphError(f"building: {body.name} is not a sub-graph of {here.name}")
        here._inner = body
        try:
            yield body
        finally:
            here._inner = None

    def subgraph(self, name: str) -> "Graph":
        """An empty graph nested in this one (a control-flow body): it may use this graph's tensors,
        and those of the graphs around it, which it reads through placeholders (`captures`)."""
        return Graph(f"{self.name}/{name}", parent=self)

    def _capture(self, t: Tensor, op: str) -> Tensor:
        """The placeholder through which this sub-graph reads `t`, a tensor of an enclosing graph."""
        outer = self.parent
        while outer is not None and t.graph is not outer:
            outer = outer.parent
        if outer is None:
            raise GraphError(f"{op}: input {t.name} belongs to another graph")
        if t.graph is not self.parent:  # a grandparent's tensor comes in through the parent's capture
            t = self.parent._capture(t, op)
        inner = self._captured.get(t.id)
        if inner is None:
            attrs = {"shape": t.shape, "dtype": t.dtype}
            inner = self._append("placeholder", [], attrs, f"captured_{t.name}", None).outputs[0]
            self._captured[t.id] = inner
            self.captures.append(t)
        return inner

    def _error(self, op: str, message: str, inputs: Sequence[Any] = ()) -> ShapeError:
        """A build-time error naming the op, the inputs and the user's line."""
        described = ", ".join(f"{t.name}: {t.type}" if isinstance(t, Tensor) else repr(t) for t in inputs) or "none"
        return ShapeError(f"{op}: {message}; inputs: {described}; built at {_user_location()}")

    def _checked(self, op: str, inputs: Sequence[Any], fn, *args):
        """`fn(*args)` for a builder of `op`: a ShapeError it raises names the op, inputs and user's line."""
        try:
            return fn(*args)
        except ShapeError as e:
            raise self._error(op, str(e), inputs) from None

    def promote(self, *values: Any, name: str = "op") -> list[Tensor]:
        """Bring operands to one dtype (dtypes.py's rule), inserting casts where needed.

        `name` is the op being built: a Python int that the integer type it would take cannot hold
        (``uint8_tensor + 300``) is an error naming it, as in NumPy 2, never a wrap-around.
        """
        tensors = [v for v in values if isinstance(v, Tensor)]
        target = None
        for t in tensors:
            target = t.dtype if target is None else dtypes.promote(target, t.dtype)
        for v in values:
            if not isinstance(v, Tensor) and isinstance(v, (bool, int, float)):
                weak = dtypes.scalar_dtype(v, target)
                target = weak if target is None else dtypes.promote(target, weak)
        if target is not None and target.is_integer:
            info = torch.iinfo(target.torch)
            for v in values:
                if isinstance(v, int) and not isinstance(v, bool) and not info.min <= v <= info.max:
                    raise self._error(name, f"the Python int {v} does not fit {target} [{info.min}, {info.max}]; "
                                            f"cast the tensor to a wider type first", tensors)
        out = [self.as_tensor(v, target) for v in values]
        if target is None:
            target = out[0].dtype
            for t in out[1:]:
                target = dtypes.promote(target, t.dtype)
        return [t if t.dtype == target else self.cast(t, target) for t in out]

    @contextlib.contextmanager
    def control_dependencies(self, operations: Iterable[Operation | Tensor]):
        """Operations built inside run after `operations` (MPSGraph controlDependency).

        A `read_variable` built here sees the value written by an assignment it
        depends on, instead of the value at the start of the run.
        """
        ops = tuple(o.op if isinstance(o, Tensor) else o for o in operations)
        for o in ops:
            if not isinstance(o, Operation) or o.graph is not self:
                raise GraphError("control_dependencies: expected operations or tensors of this graph")
        self._control_stack.append(ops)
        try:
            yield
        finally:
            self._control_stack.pop()

    @contextlib.contextmanager
    def scope(self, name: str):
        """Ops built inside carry `name` in their scope (shown by dumps and the debugger)."""
        self._scope_stack.append(name)
        try:
            yield
        finally:
            self._scope_stack.pop()

    # -- inspection ----------------------------------------------------------
    @property
    def placeholders(self) -> list[Tensor]:
        return [op.outputs[0] for op in self.operations if op.op == "placeholder"]

    @property
    def variables(self) -> list[Tensor]:
        return [op.outputs[0] for op in self.operations if op.op == "variable"]

    def tensor(self, name: str) -> Tensor:
        """Look a tensor up by name."""
        for op in self.operations:
            for t in op.outputs:
                if t.name == name:
                    return t
        raise GraphError(f"graph {self.name!r} has no tensor named {name!r}")

    def __str__(self) -> str:
        from .serialize import dump_text

        return dump_text(self)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.operations)} operations)"

    # -- variables -----------------------------------------------------------
    def _check_variable(self, v: Tensor) -> Operation:
        if not isinstance(v, Tensor) or v.graph is not self or v.op.op != "variable":
            raise GraphError(f"expected a variable of this graph (made by graph.variable), got {v!r}")
        return v.op

    def variable_value(self, v: Tensor) -> "TensorData":
        """A copy of the variable's current value (after the runs so far), as TensorData on its device.

        A copy, taken between runs: later runs (compiled ones write variables in place) never change it.
        """
        from .tensor_data import TensorData

        op = self._check_variable(v)
        with self._run_lock:
            value = self._variable_values.get(op.id)
            return TensorData._wrap((op.attrs["initial_value"] if value is None else value).clone())

    def set_variable_value(self, v: Tensor, value: Any) -> None:
        """Overwrite a variable between runs (loading a checkpoint, say); the graph keeps a copy."""
        from .tensor_data import TensorData

        op = self._check_variable(v)
        data = TensorData(value).torch()
        if data.dtype != v.dtype.torch or tuple(data.shape) != v.shape:
            raise GraphError(
                f"set_variable_value: variable {v.name} is {v.type}, got {tuple(data.shape)} {data.dtype}"
            )
        with self._run_lock:
            old = self._variable_values.get(op.id)
            device = old.device if old is not None else data.device
            self._variable_values[op.id] = data.to(device).clone(memory_format=torch.contiguous_format)

    # -- running ---------------------------------------------------------------
    def run(self, feeds=None, targets=(), target_ops=(), device=None, compiled: bool | None = None,
            buckets: dict | None = None):
        """Run what `targets` and `target_ops` need; returns {target: TensorData}.

        Feeds map placeholders to TensorData (or arrays). On CUDA the graph is
        compiled once per input signature (feed shapes and dtypes, targets,
        device) into a cached executable (`compile_log` says why each compile
        happened). On the CPU it runs op by op through the reference
        implementations, and a signature run a third time is compiled to native
        CPU kernels when a C++ compiler is there (STITCHML_CPU_COMPILE_AFTER
        sets after how many runs). `compiled=False` forces the op-by-op path
        anywhere, `compiled=True` compiles at once. The semantics are the same
        either way (docs/semantics.md).

        `buckets` ({placeholder: {axis: rule}}, default `self.buckets`) rounds those extents up
        (runtime/buckets.py: "pow2", multiples of N, or edges) so that one executable serves every size
        of a bucket, with results equal to an unpadded run; runs with buckets are compiled, on the CPU too.
        """
        if compiled is not False and self._executables is not None and not (buckets or self.buckets):
            with self._run_lock:  # a request seen before: its executable from identities, shapes and dtypes
                exe = self._executables.fast(feeds, targets, target_ops, device, compiled)
            if exe is not None:
                return exe.run(feeds)
        from .runtime.compiled import ExecutableCache, compiles_by_default
        from .runtime.eager import check_request, run_graph
        from .tensor_data import resolve_device

        dev = resolve_device(device)
        buckets = self.buckets if buckets is None else buckets
        if compiled is False or (compiled is None and not compiles_by_default(dev) and not buckets):
            return run_graph(self, feeds, targets, target_ops, dev)
        request = targets, target_ops
        targets, target_ops = check_request(self, targets, target_ops)
        with self._run_lock:  # the cache is shared by every thread that runs this graph
            if self._executables is None:
                self._executables = ExecutableCache()
            cold = compiled is None and dev.type != "cuda" and not buckets and not self._executables.warm(
                self, feeds or {}, targets, target_ops, dev)
            exe = None if cold else self._executables.get(self, feeds or {}, targets, target_ops, dev, buckets)
            if exe is not None and not buckets:
                self._executables.remember(exe, feeds, *request, device, compiled)
        return run_graph(self, feeds, targets, target_ops, dev) if cold else exe.run(feeds)

    @property
    def compile_log(self) -> list[str]:
        """One line per compile made by `run`, saying which part of the signature was new (or that it was
        evicted before), and one per eviction from the executable cache."""
        return [] if self._executables is None else list(self._executables.log)

    @property
    def bucket_log(self) -> list[str]:
        """For the latest bucketed runs (up to 256), which bucket served which feed shapes."""
        return [] if self._executables is None else list(self._executables.served)

    def run_async(self, feeds=None, targets=(), target_ops=(), device=None, on_complete=None):
        """Queue a run; returns a handle with .wait(), .result(), .done().

        Runs of one graph execute in the order they were queued.
        `on_complete(results, error)` is called when the run ends, with one of the two None.
        """
        from .runtime.asyncrun import submit

        return submit(self, lambda: self.run(feeds, targets, target_ops, device), on_complete)

    def compile(self, feeds: dict | None = None, targets=(), target_ops=(), device=None,
                options: dict | None = None, buckets: dict | None = None) -> "Executable":
        """Compile for one input signature: {placeholder: TensorType} (or example TensorData/arrays).

        Returns an Executable (runtime/executable.py) whose runs keep the eager
        semantics exactly; see passes/__init__.py for the pipeline. With `buckets` (default
        `self.buckets`; see `run`), a BucketedExecutable that runs every feed size rounding up to the
        same buckets as `feeds`.
        """
        from .runtime.compiled import compile_bucketed, compile_graph

        buckets = self.buckets if buckets is None else buckets
        if buckets:
            return compile_bucketed(self, feeds or {}, targets, target_ops, device, options or {}, buckets)
        return compile_graph(self, feeds or {}, targets, target_ops, device, options or {})

    # -- autodiff -------------------------------------------------------------
    def gradients(self, of: Tensor, wrt: Sequence[Tensor], initial_gradient: Tensor | None = None
                  ) -> dict[Tensor, Tensor]:
        """Reverse-mode gradients of `of` w.r.t. each `wrt` tensor, built into this graph.

        `of` must be a scalar unless `initial_gradient`, a tensor of `of`'s shape, is given: the
        result is then the vector-Jacobian product (torch.autograd.grad's grad_outputs).

        >>> import numpy as np, stitchml as sm
        >>> g = sm.Graph(); x = g.placeholder((3,), sm.float64, name="x")
        >>> dx = g.gradients(g.reduction_sum(x * x), [x])[x]
        >>> g.run({x: np.array([1.0, 2.0, 3.0])}, [dx], device="cpu")[dx].numpy().tolist()
        [2.0, 4.0, 6.0]
        >>> v = g.constant(np.array([1.0, 0.0, -1.0]))
        >>> dv = g.gradients(x * x, [x], initial_gradient=v)[x]
        >>> g.run({x: np.array([1.0, 2.0, 3.0])}, [dv], device="cpu")[dv].numpy().tolist()
        [2.0, 0.0, -6.0]
        """
        from .autodiff import gradients

        return gradients(self, of, wrt, initial_gradient)

    # -- serialization -------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the graph as JSON at `path` and its tensors to `path` + '.safetensors'.

        The variables' current values and `run_count` are saved too (between runs, under the run
        lock), so `Graph.load` gives back a graph that continues exactly as this one would.
        """
        from .serialize import save

        save(self, path)

    @staticmethod
    def load(path: str | os.PathLike) -> "Graph":
        """The graph `save` wrote, with its variables' values and run count as they were saved."""
        from .serialize import load

        return load(path)
