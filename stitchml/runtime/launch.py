"""launch: the launch plan the compiler hands an executable, and the kinds of work a step does.

`passes/lower.py` decides what each operation of a compiled program becomes
and builds a `LaunchPlan`; the classes below are what its steps run, each a
callable `fn(env)` over the environment list of value slots:

* `KernelLaunch`: a generated Triton kernel on its pre-bound slots;
* `VendorCall`: a contraction's library call (cuBLAS / cuDNN through torch);
* `CublasLtCall`: a matrix product with cuBLASLt's bias / ReLU / GeLU epilogue;
* `ViewOf`: a zero-copy torch view of a slot (`SameSourceView`: made again only for a new source);
* `ReferenceCall`: an op's reference implementation (opaque ops; kernels on
  the reference backend, which run their bodies op by op);
* `FreshOutputs`: a generated kernel in place of an op's library call (the
  gradient of a max pooling whose windows tile its input);
* `Chain`: several of these in order (a vendor call, then its epilogue);
* `Carve`: temporaries cut from a kernel's scratch for the steps it runs;
* `Workspace`: buffers a step keeps for itself across runs (a grid barrier's).

They hold the callables and attributes they need, not the ops, so the
runtime knows nothing of how a program was made; the op names and the lines
that built them travel on the `Step` (runtime/steps.py) for errors.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from . import direct as direct_launch, loader
from ..ir import Operation
from .steps import Step

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # CUDA builds: the current stream as an int


@dataclass
class LaunchPlan:
    """What `lower` produces: the steps in schedule order and the environment they run over.

    `slots` maps every program tensor id to its slot; `scratch_slots` maps a kernel's op id to the
    slot of its temporary (planned scratch, or a convolution's own result); `checks` are the ops
    whose integer divisions kernels flag, by code, in the one-element buffer at `flag_slot` (None
    when no kernel divides integers).
    """

    steps: list[Step] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)
    scratch_slots: dict[int, int] = field(default_factory=dict)
    checks: list[Operation] = field(default_factory=list)
    flag_slot: int | None = None
    extra_slots: int = 0  # slots after the flag's, for temporaries carved from a kernel's scratch (`Carve`)

    @property
    def nslots(self) -> int:
        """The length of a run's environment list."""
        if self.extra_slots:
            return len(self.slots) + len(self.scratch_slots) + 1 + self.extra_slots
        return len(self.slots) + len(self.scratch_slots) + (self.flag_slot is not None)


def specialisation(sizes) -> tuple[str, ...]:
    """How Triton specialises each integer argument of a launch, and so which binary it runs: "1" (the value
    1, a constant), "16" (divisible by 16: vector loads and stores), "i64" (too large for 32 bits) or "any"."""
    return tuple("1" if n == 1 else "i64" if n >= 2**31 else "16" if n % 16 == 0 else "any" for n in sizes)


def variant_sizes(sizes) -> list[tuple[int, ...]]:
    """Sizes near `sizes` for every combination of the classes "16" and "any" of its arguments: launching
    (or warming up) a kernel with each compiles every binary that another batch size of the same blocks
    needs. `sizes` itself is among them when it has no argument of class "1" or "i64"."""
    choices = []
    for n in sizes:
        multiple = n if n % 16 == 0 and n > 1 else max(16, (n + 15) // 16 * 16)
        other = n if n % 16 and n > 1 else n + 1
        choices.append(tuple(v for v in (multiple, other) if v < 2**31))
    return list(itertools.product(*choices))


def launches(fn) -> Iterator["KernelLaunch"]:
    """The kernel launches a step's run makes or may make: through chains, carved scratch and every
    candidate of a measured choice."""
    if isinstance(fn, KernelLaunch):
        yield fn
    for inner in getattr(fn, "fns", ()):  # Chain
        yield from launches(inner)
    if isinstance(fn, Carve):
        yield from launches(fn.fn)
    if isinstance(fn, FreshOutputs):
        yield from launches(fn.launch)
    for inner in getattr(fn, "candidates", {}).values():  # choices.Chooser
        yield from launches(inner)


class KernelLaunch:
    """Launch a generated kernel (`source`: a codegen KernelSource) on its pre-bound slots.

    The first launch goes through Triton's JIT entry (it compiles, or loads
    from Triton's disk cache). Later launches on CUDA write the buffers'
    addresses into a parameter block prepared once and call the driver
    (runtime/direct.py); where that launch is not known to be exact, they call
    the compiled kernel's own launcher, which still skips Triton's per-call
    argument binding. Both fall back to the JIT entry when the pointers'
    16-byte alignment differs from what the kernel was specialised for.

    With `variants` set (compiling a package's kernels), the first launch also
    compiles the kernel for the other specialisations of its size arguments
    (`variant_sizes`), so a bundle serves other batch sizes with its binaries.
    """

    def __init__(self, source, ins: list[int], outs: list[int]):
        self.fn = loader.load(source.name, source.source)
        self.grid = tuple(source.grid) + (1,) * (3 - len(source.grid))
        self.meta = source.constexprs
        self.meta_values = list(source.constexprs.values())
        self.warps = source.num_warps
        stages = getattr(source, "num_stages", None)
        self.launch_options = {"num_warps": source.num_warps} | ({"num_stages": stages} if stages else {})
        self.sizes = getattr(source, "sizes", ())  # extents the kernel takes as arguments, after its buffers
        self.slots = ins + outs
        self.compiled = None
        self.direct = None  # a direct.DirectLaunch, once the first launch has compiled the kernel
        self.launcher = "triton"  # how later launches go: "direct", or why not (reports, benchmarks)
        self.device_index = 0
        self.alignment = None
        self.interpret = loader.interpreting()
        self.source = source.source
        self.file = loader.file_name(source.source)
        self.variants = False
        # (constexprs, launch options) of the same source at other batch sizes (a bundle compiles them too)
        self.alternatives = [({**self.meta, **meta}, {**self.launch_options, "num_warps": warps})
                             for meta, warps in getattr(source, "alternatives", ())]

    def binary(self, sizes=None, meta: dict | None = None, launch_options: dict | None = None) -> list[str]:
        """What picks the binary that a launch with `sizes` (default: its own) runs, besides the source:
        the sizes' specialisation, then the constexprs and launch options (default: its own) as "name=value"."""
        options = {**(self.meta if meta is None else meta),
                   **(self.launch_options if launch_options is None else launch_options)}
        return list(specialisation(self.sizes if sizes is None else sizes)) + [f"{k}={v}" for k, v in options.items()]

    def binaries(self) -> list[list[str]]:
        """Every binary a bundle compiles for this launch: its blocks and those of other batch sizes
        (`alternatives`), each for every specialisation class of its sizes (`variant_sizes`)."""
        sizes = variant_sizes(self.sizes) + [tuple(self.sizes)]
        return [self.binary(s, meta, opts) for meta, opts in [(None, None)] + self.alternatives for s in sizes]

    def __call__(self, env: list) -> None:
        direct = self.direct
        if direct is not None and direct(env, _raw_stream(self.device_index)):
            return
        args = [env[s] for s in self.slots]
        if self.compiled is not None:
            if tuple(a.data_ptr() % 16 == 0 for a in args) == self.alignment:
                k = self.compiled
                stream = _raw_stream(args[0].device.index) if _raw_stream else torch.cuda.current_stream().cuda_stream
                k.run(*self.grid, stream, k.function, k.packed_metadata, None, None, None, *args, *self.sizes,
                      *self.meta_values)
                return
        if self.interpret:
            # masked lanes may compute log(0) and the like; the interpreter runs one launch at a time
            with loader.interpreter_lock, np.errstate(all="ignore"):
                self.fn[self.grid](*args, *self.sizes, **self.launch_options, **self.meta)
            return
        k = self.fn[self.grid](*args, *self.sizes, **self.launch_options, **self.meta)
        if self.variants:
            self.variants = False
            for meta, opts in [(self.meta, self.launch_options)] + self.alternatives:
                for sizes in variant_sizes(self.sizes):
                    if sizes != tuple(self.sizes) or meta is not self.meta:
                        self.fn.warmup(*args, *sizes, grid=self.grid, **opts, **meta)
        if self.compiled is None and all(hasattr(k, a) for a in ("run", "function", "packed_metadata")):
            self.compiled = k
            self.alignment = tuple(a.data_ptr() % 16 == 0 for a in args)
            if _raw_stream is not None and args and args[0].is_cuda:
                self.device_index = args[0].device.index
                try:
                    self.direct, self.launcher = direct_launch.bind(k, self.grid, self.slots, tuple(self.sizes),
                                                                    self.alignment)
                except Exception as e:  # noqa: BLE001  (a Triton of another shape: its own launcher still works)
                    self.launcher = f"{type(e).__name__}: {e}"


class FreshOutputs:
    """A generated kernel (`launch`) for an op that is otherwise a library call: its outputs are allocated
    per run, as a library call's are (memory of its own, not the arena), and where an input is not
    contiguous (the kernel reads row-major memory) the op's reference call (`otherwise`) runs instead."""

    def __init__(self, launch: KernelLaunch, ins: list[int], outs: list[tuple[int, tuple, torch.dtype]],
                 otherwise: Callable[[list], None]):
        self.launch, self.ins, self.outs, self.otherwise = launch, ins, outs, otherwise

    def __call__(self, env: list) -> None:
        for s in self.ins:
            if not env[s].is_contiguous():
                self.otherwise(env)
                return
        device = env[self.ins[0]].device
        for slot, shape, dtype in self.outs:
            env[slot] = torch.empty(shape, dtype=dtype, device=device)
        self.launch(env)


class Chain:
    """Run several step functions in order."""

    def __init__(self, *fns: Callable[[list], None]):
        self.fns = fns

    def __call__(self, env: list) -> None:
        for fn in self.fns:
            fn(env)


class Carve:
    """Bind typed views of a kernel's byte scratch buffer to slots of their own, then run `fn`: the
    temporaries of a kernel that runs as several steps (producer kernels, a vendor call, an epilogue).
    `parts` holds (slot, byte offset, bytes, torch dtype, shape) per temporary."""

    def __init__(self, scratch: int, parts: list[tuple[int, int, int, torch.dtype, tuple]],
                 fn: Callable[[list], None]):
        self.scratch, self.parts, self.fn = scratch, parts, fn

    def __call__(self, env: list) -> None:
        buf = env[self.scratch]
        for slot, start, nbytes, dtype, shape in self.parts:
            env[slot] = buf[start:start + nbytes].view(dtype).view(shape)
        self.fn(env)


class Workspace:
    """Bind buffers of a step's own to slots, then run `fn`: memory that lives as long as the step and
    starts zeroed (a grid barrier's counters, which every launch leaves as it found them). `buffers` holds
    (slot, shape, torch dtype); they are made on the device of the tensor at slot `like` on first use."""

    def __init__(self, buffers: list[tuple[int, tuple, torch.dtype]], like: int, fn: Callable[[list], None]):
        self.buffers, self.like, self.fns = buffers, like, (fn,)
        self.held: list[torch.Tensor] | None = None

    def __call__(self, env: list) -> None:
        if self.held is None:
            device = env[self.like].device
            self.held = [torch.zeros(shape, dtype=dtype, device=device) for _, shape, dtype in self.buffers]
        for (slot, _, _), buf in zip(self.buffers, self.held):
            env[slot] = buf
        self.fns[0](env)


class VendorCall:
    """A contraction's library call `call(out, *inputs, **attrs)` (the registry's Primitive.vendor): it
    writes into the buffer bound at `out_slot`, or binds its own result there."""

    def __init__(self, call: Callable[..., torch.Tensor], ins: list[int], out_slot: int, attrs: dict[str, Any]):
        self.call, self.ins, self.out_slot, self.attrs = call, ins, out_slot, attrs

    def __call__(self, env: list) -> None:
        env[self.out_slot] = self.call(env[self.out_slot], *[env[s] for s in self.ins], **self.attrs)


class CublasLtCall:
    """out = a @ b + bias, then ReLU or tanh GeLU for `kind` "bias_relu" / "bias_gelu": cuBLASLt runs the
    epilogue inside the GEMM."""

    KINDS = ("bias", "bias_relu", "bias_gelu")

    def __init__(self, kind: str, a: int, b: int, bias: int, out: int):
        assert kind in self.KINDS, kind
        self.kind, self.a, self.b, self.bias, self.out = kind, a, b, bias, out

    def __call__(self, env: list) -> None:
        bias_1d = env[self.bias].reshape(-1)
        if self.kind == "bias":
            torch.addmm(bias_1d, env[self.a], env[self.b], out=env[self.out])
        else:
            torch._addmm_activation(bias_1d, env[self.a], env[self.b], use_gelu=self.kind == "bias_gelu",
                                    out=env[self.out])


class ViewOf:
    """Bind `dst` to `impl(env[src], **attrs)`, a torch view of the source (no copy)."""

    def __init__(self, impl: Callable[..., torch.Tensor], src: int, dst: int, attrs: dict[str, Any]):
        self.impl, self.src, self.dst, self.attrs = impl, src, dst, attrs

    def __call__(self, env: list) -> None:
        env[self.dst] = self.impl(env[self.src], **self.attrs)


class SameSourceView(ViewOf):
    """A `ViewOf` that makes its view again only when its source is another tensor than last run's: most
    sources (arena buffers, variables) are the same tensor every run. On the CPU a torch view costs a few
    microseconds in a loop but tens after a kernel has streamed megabytes through the caches; the
    digit classifier's step has twelve. Holds the last source, so its identity cannot be reused."""

    def __init__(self, impl: Callable[..., torch.Tensor], src: int, dst: int, attrs: dict[str, Any]):
        super().__init__(impl, src, dst, attrs)
        self.source = self.view = None

    def __call__(self, env: list) -> None:
        source = env[self.src]
        if source is not self.source:
            self.view = self.impl(source, **self.attrs)
            self.source = source
        env[self.dst] = self.view


class ReferenceCall:
    """Run an op's reference implementation `impl(*inputs, **attrs)`.

    Its results are bound as they come (library memory), or copied into
    planned buffers with `into`. A result that is one of the inputs' memory is
    copied, so no output or assignment ever aliases a feed, constant or
    variable; a strided result (a slice, a transposed convolution) is made
    row-major, the layout the plan gives every buffer. Ops that need a run
    context (random draws: the run index picks the numbers) get `context()`
    as their first argument.
    """

    def __init__(self, impl: Callable[..., Any], ins: list[int], outs: list[int], attrs: dict[str, Any],
                 into: bool = False, context: Callable[[], Any] | None = None):
        self.impl, self.ins, self.outs, self.attrs = impl, ins, outs, attrs
        self.into, self.context = into, context

    def __call__(self, env: list) -> None:
        args = [env[s] for s in self.ins]
        context = self.context
        result = self.impl(context(), *args, **self.attrs) if context else self.impl(*args, **self.attrs)
        result = result if isinstance(result, tuple) else (result,)
        shared = {a.untyped_storage().data_ptr() for a in args}
        for s, r in zip(self.outs, result):
            if self.into:
                env[s].copy_(r)
            else:
                shares = r.untyped_storage().data_ptr() in shared
                env[s] = r.clone(memory_format=torch.contiguous_format) if shares else r.contiguous()


_C = torch._C  # the flags' own accessors: torch.backends' properties cost a few microseconds more per call


def _tf32_flags() -> tuple[bool, bool] | None:
    """torch's (cuBLAS, cuDNN) TF32 flags; None when torch refuses to say (the process has set them through
    both its legacy and its newer precision API, which torch reports as an error)."""
    try:
        return _C._get_cublas_allow_tf32(), _C._get_cudnn_allow_tf32()
    except RuntimeError:
        return None


def _set_tf32(matmul: bool, conv: bool) -> None:
    _C._set_cublas_allow_tf32(matmul)
    _C._set_cudnn_allow_tf32(conv)


class TF32:
    """Run a library call (cuBLAS, cuDNN) with TF32 tensor cores allowed or not, whatever torch's global
    flags say, and put the flags back afterwards: an executable's float32 products and convolutions
    follow its own `allow_tf32` option (runtime/compiled.py), not the state another part of the process
    left. The flags are read when the library picks its kernel, so a CUDA-graph capture of the call
    records the executable's choice too. Where torch refuses to report its flags (its two precision APIs
    mixed), the call runs under them as they are."""

    def __init__(self, fn: Callable[[list], None], allow: bool):
        self.fn, self.allow = fn, allow

    def __call__(self, env: list) -> None:
        saved = _tf32_flags()
        if saved is None:
            self.fn(env)
            return
        _set_tf32(self.allow, self.allow)
        try:
            self.fn(env)
        finally:
            _set_tf32(*saved)
