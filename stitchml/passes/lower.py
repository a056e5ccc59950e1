"""lower: turn the stitched, planned program into a list of pre-bound steps.

Requires: `ctx.memory_plan`. Ensures: `ctx.launch_plan` is the `LaunchPlan`
(runtime/launch.py) that `build_launch_plan` returns: one step per operation
that does work, in schedule order, each reading and writing value slots of an
environment list, and the map from tensor ids to slots. This pass decides
what each operation becomes; the step kinds it builds live in the runtime.

* pointwise and reduction kernels: generated Triton source (codegen/),
  loaded from the kernel cache and launched with their grid;
* matmul / convolution kernels: the vendor call (cuBLAS / cuDNN through
  torch) writes a scratch buffer, then a generated epilogue kernel reads it;
  with no epilogue the vendor call writes the output directly;
* views: a torch view of the input (no copy);
* opaque ops: their reference implementation, result copied into its buffer;
* with the native backend (CPU, a C++ compiler) kernels become C++ loop nests,
  an executable's kernels compiled together (codegen/cpu.py);
* with the reference backend (CPU without a compiler or the Triton
  interpreter) kernels run their bodies op by op;
* control-flow ops: a step running their blocks, each compiled once
  (passes/control.py).

Every step carries the user's ops it computes (a fused kernel: all of them; a
vendor call, gather or view: its op), so a step that fails raises the
`ExecutionError` an op-by-op run raises: the op, its name and the line that
built it (`failure`, runtime/steps.py). Kernels that divide integers flag a zero divisor in a
one-element buffer (`ctx.checks`: the flagged ops, by code) that the run
reads once at its end (`raise_flagged`): a kernel cannot raise.
"""
from __future__ import annotations

import functools
import hashlib
import logging

import torch

from ..codegen import (attention, attention_backward, convolution, cpu, cpu_window, lstm, lstm_step, matmul,
                       matmul_tma, pointwise, pooling, product_argmax, reduction)
from ..runtime import choices, native_conv
from ..codegen.common import Layout
from ..dtypes import float32
from ..errors import StitchError
from ..graph import Graph
from ..ir import Operation, built_at
from ..registry import lookup
from ..registry import CONTRACTION
from ..runtime.launch import (Carve, Chain, CublasLtCall, FreshOutputs, KernelLaunch, LaunchPlan, ReferenceCall, TF32,
                              SameSourceView, VendorCall, ViewOf, Workspace)
from ..runtime.steps import Step
from ..runtime.tma import TmaLaunch
from . import slabs
from .control import CONTROL_FLOW, control_step
from .memory import _is_view, prologue_mode, separate_scratch
from .program import CompileError, Program, copy_op

log = logging.getLogger("stitchml.compile")


def _layouts(op: Operation, plan) -> list[Layout]:
    out = []
    for t in op.inputs:
        lay = plan.place[t.id][2]
        out.append(Layout(lay.shape, lay.strides, 0))  # the slot holds the view: its pointer includes the offset
    return out


def _generate(name: str, template: str, body: Program, layouts: list[Layout], interpret: bool, options: dict):
    gen = reduction.generate if template == "reduction" else pointwise.generate
    return gen(name, body, layouts, interpret, options)


def _epilogue(body: Program) -> tuple[Operation, Program | None, list[int]]:
    """Split a matmul/convolution body into the contraction and a pointwise epilogue body.

    Returns the contraction op, the epilogue (None when there is none) and, for
    each epilogue input after the contraction result, the index of the body
    placeholder it is.
    """
    parts = matmul.split(body)
    if not parts.epilogue:
        return parts.contraction, None, []
    return (parts.contraction, *_after(body, parts.contraction, parts.epilogue))


def _after(body: Program, head: Operation, rest: list[Operation] | None = None) -> tuple[Program, list[int]]:
    """The ops of `body` after its first op `head` (`rest`: all but placeholders and `head`) as a program
    of their own reading `head`'s result as its first placeholder, and, for each of its other inputs, the
    index of the body placeholder it is."""
    if rest is None:
        rest = [op for op in body.operations if op.op != "placeholder" and op is not head]
    g = Graph("epilogue")
    mapping = {head.outputs[0].id: g.placeholder(head.outputs[0].shape, head.outputs[0].dtype)}
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    used = []
    for op in rest:
        for t in op.inputs:
            if t.id not in mapping and t.op.op == "placeholder":
                mapping[t.id] = g.placeholder(t.shape, t.dtype)
                used.append(placeholders.index(t))
        for old, new in zip(op.outputs, copy_op(g, op, [mapping[t.id] for t in op.inputs])):
            mapping[old.id] = new
    return Program(g, [mapping[t.id] for t in body.outputs], dict(body.notes)), used


def _split_contraction(op: Operation, plan):
    """A matmul/convolution kernel's contraction, its pointwise epilogue (None: none), the indices of the body
    placeholders the epilogue reads, the body's placeholders, and the epilogue's input layouts (the
    contiguous product first): what both the Triton and the native CPU lowering need."""
    body = op.attrs["body"]
    contraction, epi, used = _epilogue(body)
    placeholders = [o.outputs[0] for o in body.operations if o.op == "placeholder"]
    layouts = [Layout.contiguous(contraction.outputs[0].shape)] + [_layouts(op, plan)[i] for i in used]
    return contraction, epi, used, placeholders, layouts


def _vendor(contraction: Operation, placeholders, ins: list[int], out_slot: int, options: dict,
            native: bool = False) -> TF32 | VendorCall:
    """The contraction's library call (registry: Primitive.vendor), writing or binding `out_slot`, under the
    executable's TF32 choice; with `native`, the native CPU backend's convolution call where it has one
    (runtime/native_conv.py)."""
    slots = [ins[placeholders.index(t)] for t in contraction.inputs]
    fast = native_conv.call(contraction) if native else None
    if fast is not None:
        return VendorCall(lambda out, *args: _row_major(fast(*args)), slots, out_slot, {})
    if native:  # the CPU has no TF32
        return VendorCall(lookup(contraction.op).vendor, slots, out_slot, contraction.attrs)
    return _precision(VendorCall(lookup(contraction.op).vendor, slots, out_slot, _library_attrs(contraction, options)),
                      options)


_CONVOLUTIONS = ("convolution2d", "convolution_transpose2d", "convolution2d_weights_gradient")


def _library_attrs(op: Operation, options: dict) -> dict:
    """The op's attributes for its library call: with compile option `conv_channels_last` True, convolutions
    hand cuDNN channels-last operands (ops/contraction.py); "measure" leaves that to `_channels_last_twin`."""
    if _channels_last_mode(options) is True and op.op in _CONVOLUTIONS:
        return {**op.attrs, "channels_last": True}
    return op.attrs


def _channels_last_mode(options: dict) -> bool | str:
    """Option `conv_channels_last`: False (the default), True (cuDNN gets channels-last copies of every
    convolution's operands) or "measure" (on CUDA each convolution's first run also times that form)."""
    mode = options.get("conv_channels_last", False)
    if mode not in (False, True, "measure"):
        raise CompileError(f"option conv_channels_last expects False, True or 'measure', got {mode!r}")
    return mode


def _channels_last_twin(make, options: dict, backend: str) -> dict:
    """{"library-channels-last": the library form built by `make(options)` with channels-last operands} when
    option `conv_channels_last` is "measure" on CUDA (a candidate of the convolution's measured choice),
    else {}."""
    if backend != "triton" or _channels_last_mode(options) != "measure":
        return {}
    return {"library-channels-last": make({**options, "conv_channels_last": True})}


def _precision(run, options: dict) -> TF32:
    """`run`, a library call of float32 products or convolutions, with TF32 allowed exactly when the compile
    options say so (`allow_tf32`, off by default), whatever torch's global flags are."""
    return TF32(run, bool(options.get("allow_tf32", False)))


def _row_major(y: torch.Tensor) -> torch.Tensor:
    # oneDNN may answer channels-last where an operand has one channel; the epilogue reads row-major
    return y if y.is_contiguous() else y.contiguous()


def lower(program: Program, ctx) -> Program:
    """The pass: `ctx.launch_plan` becomes the program's launch plan; the program is unchanged."""
    ctx.launch_plan = build_launch_plan(program, ctx.memory_plan, ctx.backend, ctx.options, ctx.run_context, ctx)
    return program


def build_launch_plan(program: Program, plan, backend: str, options: dict, run_context=None,
                      ctx=None) -> LaunchPlan:
    """The steps that run `program` with memory plan `plan` on `backend`, and the slots they use
    (`ctx`, the compile context, compiles the blocks of control-flow ops)."""
    slots: dict[int, int] = {}
    for op in program.operations:
        for t in op.outputs:
            slots[t.id] = len(slots)
    # One extra slot per kernel that needs a temporary: planned scratch, or a convolution's own result.
    temps = [op.id for op in program.operations if op.op == "fusion" and
             (op.id in plan.scratch or op.attrs["template"] == "convolution")]
    scratch_slots = {op_id: len(slots) + i for i, op_id in enumerate(temps)}
    flag_slot = len(slots) + len(temps)  # used only when a kernel divides integers
    extra = [flag_slot + 1]  # more slots for the temporaries of a kernel run as several steps

    def new_slot() -> int:
        extra[0] += 1
        return extra[0] - 1
    checks: list[Operation] = []
    steps: list[Step] = []
    module = cpu.Module()  # the native CPU backend's kernels, compiled together below
    if backend == "native":
        options = {**options, "native_module": module}
    pools = _pooled_convolutions(program, backend, options)  # convolution kernel id -> (output index, pooling op)
    pooled = {pool.id for _, pool in pools.values()}
    sums = _pool_sums(program, backend, options)  # pooling gradient kernel id -> the reduction kernel after it
    pooled |= {r.id for r in sums.values()}
    for op in program.operations:
        if op.op in ("placeholder", "variable", "constant", "assign_variable") or op.id in pooled:
            continue
        try:
            if op.op in CONTROL_FLOW:
                step = control_step(op, [slots[t.id] for t in op.inputs], [slots[t.id] for t in op.outputs], ctx)
            else:
                total = None
                if op.id in sums:
                    total = (sums[op.id], _step(sums[op.id], plan, slots, scratch_slots, backend, options,
                                                run_context, (checks, flag_slot), new_slot))
                step = _step(op, plan, slots, scratch_slots, backend, options, run_context, (checks, flag_slot),
                             new_slot, pools.get(op.id), total)
        except StitchError:
            raise
        except Exception as e:  # a kernel the code generator cannot make: name the user's ops and lines
            ops = ", ".join(built_at(o) for o in _computes(op))
            raise CompileError(f"lower: {ops}: {type(e).__name__}: {e}") from e
        step.writes = tuple(t.id for t in op.outputs) + ((plan.scratch[op.id],) if op.id in plan.scratch else ())
        step.ops = _computes(op)
        if op.id in pools:  # the step computes the pooling of one of its outputs too
            step.writes += (pools[op.id][1].outputs[0].id,)
            step.ops += (pools[op.id][1],)
        if op.id in sums:  # and the sum per channel of one of its outputs
            r = sums[op.id]
            step.writes += tuple(t.id for t in r.outputs) + ((plan.scratch[r.id],) if r.id in plan.scratch else ())
            step.ops += _computes(r)
        step.inputs = tuple((t.name, slots[t.id]) for t in op.inputs)
        steps.append(step)
    module.build()
    for kernel, reason in module.errors.items():
        log.info("kernel %s runs through its reference implementation on the CPU: %s", kernel, reason)
    return LaunchPlan(steps, slots, scratch_slots, checks, flag_slot if checks else None, extra[0] - flag_slot - 1)


def _pooled_convolutions(program: Program, backend: str, options: dict) -> dict[int, tuple[int, Operation]]:
    """Max poolings whose windows tile an output of a convolution kernel the template may compute
    (codegen/convolution.py, `poolable`): that kernel pools in registers, the pooling has no step of its own.
    By kernel id: (the kernel's output index the pooling reads, the pooling op)."""
    if _template_mode(options, backend) is None:
        return {}
    made = {t.id: (op, i) for op in program.operations if op.op == "fusion" and
            op.attrs["template"] == "convolution" for i, t in enumerate(op.outputs)}
    found: dict[int, tuple[int, Operation]] = {}
    for op in program.operations:
        if op.op != "max_pooling2d" or op.inputs[0].id not in made:
            continue
        kernel, i = made[op.inputs[0].id]
        body = kernel.attrs["body"]
        if kernel.id in found or convolution.unsupported(matmul.split(body).contraction) or \
                convolution.poolable(body, i, op.attrs):
            continue
        found[kernel.id] = (i, op)
    return found


def _pool_sums(program: Program, backend: str, options: dict) -> dict[int, Operation]:
    """Reduction kernels that only sum an output of the pooling gradient kernel just before them per channel
    (the bias gradient after the ReLU's mask): that kernel's step runs them too, on CUDA measured against a
    form of the kernel that sums its tiles as it stores them (`_pool_epilogue_step`; option `pool_epilogue`
    "sum": that form everywhere). By pooling gradient kernel id."""
    mode = options.get("pool_epilogue", True)
    if mode == "separate" or not _template_applies("measure" if mode is True else mode, backend) or \
            _pooling_mode(options) == "windows":  # the summing kernel takes rows of windows
        return {}
    found: dict[int, Operation] = {}
    ops = [op for op in program.operations if op.op not in ("placeholder", "variable", "constant")]
    for op, after in zip(ops, ops[1:]):
        if op.op != "fusion" or op.attrs["template"] != "pool_gradient" or after.op != "fusion" or \
                after.attrs["template"] != "reduction" or len(after.inputs) != 1 or len(after.outputs) != 1 or \
                after.inputs[0].op is not op:
            continue
        pool = next(o for o in op.attrs["body"].operations if o.op == "max_pooling2d_gradient")
        inner = [o for o in after.attrs["body"].operations if o.op != "placeholder"]
        if not pooling.rows_fit(pool.attrs, pool.inputs[1].shape) or len(inner) != 1 or \
                inner[0].op != "reduction_sum" or inner[0].inputs[0].op.op != "placeholder" or \
                not _per_channel(inner[0]):
            continue
        found[op.id] = after
    return found


def _per_channel(op: Operation) -> bool:
    """Whether reduction `op` sums its NCHW input over all but the channel axis (simplify drops axes of
    extent 1 from a reduction's axes)."""
    shape, axes = op.inputs[0].shape, op.attrs["axes"]
    axes = range(len(shape)) if axes is None else [a % len(shape) for a in axes]
    return {a for a in axes if shape[a] != 1} == {a for a in (0, 2, 3) if shape[a] != 1}


def _computes(op: Operation) -> tuple[Operation, ...]:
    """The user's ops a program op computes: a kernel's body ops (their names and lines are the user's)."""
    if op.op != "fusion":
        return (op,)
    return tuple(o for o in op.attrs["body"].operations if o.op not in ("placeholder", "constant"))


def _step(op: Operation, plan, slots: dict, scratch_slots: dict, backend: str, options: dict, run_context,
          flags: tuple[list[Operation], int], new_slot, pool: tuple[int, Operation] | None = None,
          total: tuple[Operation, Step] | None = None) -> Step:
    ins = [slots[t.id] for t in op.inputs]
    outs = [slots[t.id] for t in op.outputs]
    if _is_view(op) and plan.place[op.outputs[0].id][:2] != ("buffer", op.outputs[0].id):
        view = SameSourceView if backend == "native" else ViewOf  # the CPU pays most for a step's host work
        return Step(op.name, "view", view(lookup(op.op).impl, ins[0], outs[0], op.attrs))
    if op.op != "fusion":
        prim = lookup(op.op)
        if backend == "native" and cpu_window.supports(op):
            src = cpu_window.source(f"{op.name}_native", op, _layouts(op, plan))
            options["native_module"].add(src)
            fallback = ReferenceCall(prim.impl, ins, outs, op.attrs, into=True)
            return Step(op.name, "window", cpu.NativeLaunch(options["native_module"], src, ins, outs, fallback),
                        src.source)
        fast = native_conv.call(op) if backend == "native" else None
        if fast is not None:
            return Step(op.name, "vendor", ReferenceCall(fast, ins, outs, {}))
        run = ReferenceCall(prim.impl, ins, outs, _library_attrs(op, options),
                            context=run_context if prim.needs_context else None)
        x = op.inputs[-1] if op.op == "max_pooling2d_gradient" else None  # (dy, source)
        if x is not None and backend in ("triton", "interpret") and x.dtype.is_floating and \
                pooling.fits(op.attrs, x.shape):
            return _pool_gradient_step(op, x, ins, outs, run, backend, options)
        if op.op == "max_pooling2d":
            run, source = _max_pool_run(op, op.inputs[0], ins[0], outs[0], backend, options)
            return Step(op.name, "pooling" if source else "vendor", run, source or None)
        vendor = _precision(run, options) if prim.kind == CONTRACTION else run
        twin = _channels_last_twin(lambda o: _precision(ReferenceCall(prim.impl, ins, outs, _library_attrs(op, o)), o),
                                   options, backend) if op.op in _CONVOLUTIONS else {}
        if backend in ("triton", "interpret") and op.op == "convolution_transpose2d":
            return _convolution_step(op, op, None, _layouts(op, plan), ins, outs, vendor, backend, options, "vendor",
                                     twin=twin)
        if backend in ("triton", "interpret") and op.op == "convolution2d_weights_gradient":
            return _weights_gradient_step(op, _layouts(op, plan), ins, outs, vendor, backend, options, new_slot, twin)
        if twin:
            return _measured(op.name, "vendor", convolution.key(op, op.outputs[0].dtype, options), vendor, twin, "",
                             "measure")
        return Step(op.name, "vendor", vendor)
    body, template = op.attrs["body"], op.attrs["template"]
    if backend == "reference":
        run = ReferenceCall(lookup(op.op).impl, ins, outs, op.attrs, into=True)
        return Step(op.name, "reference", _precision(run, options) if template in ("matmul", "convolution") else run)
    if backend == "native":
        return _native_step(op, plan, ins, outs, scratch_slots, flags, options)
    interpret = backend == "interpret"
    checks, flag_slot = flags
    options = {**options, "first_check": len(checks)}
    if template in ("pointwise", "reduction"):
        src = _generate(op.name, template, body, _layouts(op, plan), interpret, options)
        first = src.partial if isinstance(src, reduction.SplitSource) else src
        checks.extend(first.checks)
        flag = [flag_slot] if first.checks else []
        if isinstance(src, reduction.SplitSource):
            tmp = scratch_slots[op.id]
            run = Chain(KernelLaunch(src.partial, ins, [tmp] + outs + flag),
                        KernelLaunch(src.finish, ins + [tmp], outs + flag))
            return Step(op.name, template, run, src.partial.source)
        return Step(op.name, template, KernelLaunch(src, ins, outs + flag), src.source)
    if template == "pool_gradient":
        return _pool_epilogue_step(op, plan, ins, outs, backend, options, new_slot, total and (slots, *total))
    if template == "attention":
        src = attention.generate(op.name, body.notes["attention"], _layouts(op, plan), op.outputs[0].shape,
                                 op.inputs[0].dtype.name, interpret, options.get("attention_split", True),
                                 lse=len(op.outputs) > 1)
        return Step(op.name, template, KernelLaunch(src, ins, outs), src.source)
    if template == "lstm_step":
        return _generation_step(op, plan, ins, outs, interpret, options, flags, new_slot)
    if template in ("lstm_cell", "product_arg_max"):
        return _recurrent_step(op, template, plan, ins, outs, interpret, options, flags)
    if template == "attention_backward":
        kv, dq = attention_backward.generate(op.name, body.notes["attention"], _layouts(op, plan),
                                             [t.shape for t in op.outputs], op.inputs[0].dtype.name, interpret,
                                             options.get("attention_split", True))
        delta = [scratch_slots[op.id]]  # Δ per query row: the dQ kernel writes it, the dK/dV kernel reads it
        return Step(op.name, template, Chain(KernelLaunch(dq, ins, outs + delta), KernelLaunch(kv, ins, outs + delta)),
                    dq.source + kv.source)
    if template == "convolution" and _split_contraction(op, plan)[1] is None:
        contraction, _, _, placeholders, _ = _split_contraction(op, plan)
        vendor = _vendor(contraction, placeholders, ins, outs[0], options)
        twin = _channels_last_twin(lambda o: _vendor(contraction, placeholders, ins, outs[0], o), options, backend)
        return _convolution_step(op, contraction, body, _layouts(op, plan), ins, outs, vendor, backend, options,
                                 template, None, _pool_output(pool, outs, slots, backend, options), twin)
    if template == "matmul" and any(matmul.split(body).prologues):
        return _prologue_step(op, plan, ins, outs, scratch_slots.get(op.id), backend, options, flags, new_slot)
    contraction, epi, used, placeholders, layouts = _split_contraction(op, plan)
    if epi is None:
        return Step(op.name, template, _vendor(contraction, placeholders, ins, outs[0], options))
    tmp = scratch_slots[op.id]
    src = _generate(op.name, "pointwise", epi, layouts, interpret, options)
    checks.extend(src.checks)
    vendor = _vendor(contraction, placeholders, ins, tmp, options)
    launch = KernelLaunch(src, [tmp] + [ins[i] for i in used], outs + ([flag_slot] if src.checks else []))
    run = Chain(vendor, launch)
    if template == "convolution":
        twin = _channels_last_twin(lambda o: Chain(_vendor(contraction, placeholders, ins, tmp, o), launch), options,
                                   backend)
        return _convolution_step(op, contraction, body, _layouts(op, plan), ins, outs, run, backend, options,
                                 template, src.source, _pool_output(pool, outs, slots, backend, options), twin)
    slabbed = _slabbed(op, contraction, epi, used, placeholders, layouts, ins, outs, tmp, run, backend, options,
                       new_slot)
    if slabbed is not None:
        return Step(op.name, template, slabbed, src.source)
    candidates = {"cublas+epilogue-kernel": run}
    a, b = contraction.inputs
    fused = _cublaslt_epilogue(body, contraction, placeholders, ins, outs) if backend == "triton" else None
    if fused is not None:
        kind, fused_run = fused[0], _precision(fused[1], options)
        tf32 = ":tf32" if options.get("allow_tf32") and a.dtype.name == "float32" else ""
        key = f"matmul:{a.shape}x{b.shape}:{a.dtype}:{kind}{tf32}:{torch.cuda.get_device_name()}"
        candidates[f"cublaslt-{kind}"] = fused_run
    tma = _tma_runs(op, plan, ins, outs, run, backend, options)
    tma_source = "".join(launch.source for launch in tma.values())
    if tma and options.get("matmul_tma") == "always":
        return Step(op.name, template, next(iter(tma.values())), tma_source)
    if tma:
        digest = hashlib.sha256((src.source + tma_source).encode()).hexdigest()[:16]
        key = f"matmul-tma:{a.shape}x{b.shape}:{a.dtype}:{digest}:{torch.cuda.get_device_name()}"
        candidates |= tma
    if len(candidates) > 1:
        run = choices.Chooser(key, candidates)
    return Step(op.name, template, run, src.source + tma_source)


def _tma_runs(op: Operation, plan, ins: list[int], outs: list[int], fallback, backend: str,
              options: dict) -> dict[str, TmaLaunch]:
    """The persistent TMA template's launches of a matmul kernel with an epilogue (codegen/matmul_tma.py), by
    candidate name, each running `fallback` (cuBLAS and the epilogue kernel) where TMA's alignment rule fails at
    run time; none where option `matmul_tma` or the kernel rules the template out. The option is "never" (the
    default: on an H200 the template came within 1-2 % of cuBLAS + the epilogue kernel, either way, and did not
    reach the bare product's 1.03x; benchmarks/gemm_trials.py), "measure" (on CUDA, a candidate of the measured
    choice) or "always" (`matmul_tma.configs`)."""
    mode = options.get("matmul_tma", "never")
    if mode not in ("measure", "always", "never"):
        raise CompileError(f"option matmul_tma expects 'measure', 'always' or 'never', got {mode!r}")
    if mode == "never" or not _template_applies(mode, backend):
        return {}
    body, layouts, interpret = op.attrs["body"], _layouts(op, plan), backend == "interpret"
    capability = None if interpret else torch.cuda.get_device_capability()
    configs, why = matmul_tma.configs(body, layouts, mode, capability, options.get("matmul_tma_configs"))
    if why:
        log.info("kernel %s stays with cuBLAS and the epilogue kernel: %s", op.name, why)
        return {}
    sms = 4 if interpret else torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return {c.name: TmaLaunch(matmul_tma.generate(op.name, body, layouts, interpret, c, sms), ins, outs, fallback)
            for c in configs}


def _slabbed(op: Operation, contraction: Operation, epi: Program, used: list[int], placeholders, layouts: list[Layout],
             ins: list[int], outs: list[int], tmp: int, whole: Chain, backend: str, options: dict, new_slot):
    """With compile option `epilogue_slabs` a byte count (and `epilogue_in_place`, `epilogue_overlap`), the
    product and its epilogue in slabs (passes/slabs.py); None otherwise, or where slabs do not apply. Never
    by default: on an H200 every slab layout measured slower than the whole product (passes/slabs.py)."""
    nbytes = options.get("epilogue_slabs")
    if not nbytes or backend not in ("triton", "interpret"):
        return None
    a, b = (ins[placeholders.index(t)] for t in contraction.inputs)
    run = slabs.build(op.name, contraction, epi, layouts, a, b, [ins[i] for i in used], outs, tmp, whole,
                      _library_attrs(contraction, options), int(nbytes), bool(options.get("epilogue_in_place")),
                      bool(options.get("epilogue_overlap")), backend == "interpret", options, new_slot)
    return None if run is None else _precision(run, options)


def _pool_gradient_step(op: Operation, x, ins: list[int], outs: list[int], library, backend: str,
                        options: dict) -> Step:
    """The gradient of a max pooling whose windows tile its input (codegen/pooling.py): a program per block of
    windows, or for 2x2 windows per block of rows of windows, as option `max_pooling` says (`_pooling_mode`)."""
    mode = _pooling_mode(options)
    interpret, out = backend == "interpret", op.outputs[0]
    sources = {}
    if mode != "rows" or not pooling.rows_fit(op.attrs, x.shape):
        sources["windows"] = pooling.max_pool_gradient(f"{op.name}_kernel", x.shape, op.attrs["kernel_size"], x.dtype,
                                                       interpret)
    if mode != "windows" and (mode == "rows" or backend == "triton") and pooling.rows_fit(op.attrs, x.shape):
        sources["rows"] = pooling.max_pool_gradient_rows(f"{op.name}_rows", x.shape, x.dtype, interpret)
    launches = {k: FreshOutputs(KernelLaunch(src, ins, outs), ins, [(outs[0], out.shape, out.dtype.torch)], library)
                for k, src in sources.items()}
    source = "".join(src.source for src in sources.values())
    if len(launches) == 1:
        return Step(op.name, "pooling", next(iter(launches.values())), source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    key = f"pool-gradient:{x.shape}:{x.dtype}:{digest}:{torch.cuda.get_device_name()}"
    return Step(op.name, "pooling", choices.Chooser(key, launches), source)


def _pool_epilogue_step(op: Operation, plan, ins: list[int], outs: list[int], backend: str, options: dict,
                        new_slot, total: tuple[dict, Operation, Step] | None = None) -> Step:
    """A max pooling's gradient with the elementwise ops reading it (passes/stitch.py "pool_gradient"): one
    kernel applying them in registers (codegen/pooling.py), per block of windows or of rows of windows as
    option `max_pooling` says; on CUDA also today's gradient kernels followed by the ops' pointwise kernel,
    the fastest measured on the first run; with option `pool_epilogue` "separate" only those (everywhere).
    With `total` (slots, a reduction kernel summing an output per channel, its step: `_pool_sums`) each
    candidate runs that step after it, and the kernel that sums its tiles as it stores them is one more
    (option `pool_epilogue` "sum": that one alone). Operands that are not row-major run the body op by op."""
    body, interpret = op.attrs["body"], backend == "interpret"
    pool = next(o for o in body.operations if o.op == "max_pooling2d_gradient")
    placeholders = [o.outputs[0] for o in body.operations if o.op == "placeholder"]
    layouts = _layouts(op, plan)
    reference = ReferenceCall(lookup(op.op).impl, ins, outs, op.attrs, into=True)
    after = (lambda run: Chain(run, total[2].run)) if total is not None else (lambda run: run)
    dy, x = pool.inputs
    at = [placeholders.index(t) for t in (dy, x)]
    if any(layouts[i].strides != Layout.contiguous(layouts[i].shape).strides for i in at):
        log.info("kernel %s runs its body op by op: the pooling gradient's operands are not row-major", op.name)
        return Step(op.name, "reference", after(reference))
    mode = _pooling_mode(options)
    epilogue = options.get("pool_epilogue", True)
    rows = pooling.rows_fit(pool.attrs, x.shape)
    forms = [form for form, wanted in (("windows", mode != "rows" or not rows),
                                       ("rows", mode != "windows" and (mode == "rows" or not interpret) and rows))
             if wanted]
    launches, source = {}, ""
    if total is not None:
        slots, reduction, _ = total
        src = pooling.gradient_with_sum(f"{op.name}_sum", body, layouts, list(op.outputs).index(reduction.inputs[0]),
                                        reduction.outputs[0].dtype, interpret)
        part = new_slot()
        launches["rows+epilogue+sum"] = Workspace([(part, (src.parts,), torch.float32)], ins[0], Chain(
            KernelLaunch(src.partial, ins, outs + [part]),
            KernelLaunch(src.finish, [part], [slots[reduction.outputs[0].id]])))
        source = src.partial.source + src.finish.source
        if epilogue == "sum":
            return Step(op.name, "pooling", launches["rows+epilogue+sum"], source)
    if epilogue != "separate":
        for form in forms:
            src = pooling.gradient_with_epilogue(f"{op.name}_{form}", body, layouts, form == "rows", interpret)
            launches[f"{form}+epilogue"] = after(KernelLaunch(src, ins, outs))
            source += src.source
        if interpret:
            return Step(op.name, "pooling", launches[f"{forms[0]}+epilogue"], source)
    dx = pool.outputs[0]
    epi, used = _after(body, pool)
    kept = [j for j, t in enumerate(body.outputs) if t is not dx]  # what the pointwise kernel stores
    epi = Program(epi.graph, [epi.outputs[j] for j in kept], epi.notes)
    epi_src = pointwise.generate(f"{op.name}_epilogue", epi, [Layout.contiguous(dx.shape)] + [layouts[i] for i in used],
                                 interpret, options)
    stored = [j for j, t in enumerate(body.outputs) if t is dx]  # the gradient is read outside too
    grad = outs[stored[0]] if stored else new_slot()
    for form in forms:  # today's kernels: the gradient into memory, then the epilogue kernel
        src = pooling.max_pool_gradient_rows(f"{op.name}_rows", x.shape, x.dtype, interpret) if form == "rows" else \
            pooling.max_pool_gradient(f"{op.name}_kernel", x.shape, pool.attrs["kernel_size"], x.dtype, interpret)
        run = Chain(KernelLaunch(src, [ins[i] for i in at], [grad]),
                    KernelLaunch(epi_src, [grad] + [ins[i] for i in used], [outs[j] for j in kept]))
        launches[f"{form}+epilogue-kernel"] = after(run if stored else FreshOutputs(
            run, [ins[at[0]]], [(grad, dx.shape, dx.dtype.torch)], reference))
        source += src.source
    source += epi_src.source
    if len(launches) == 1:
        return Step(op.name, "pooling", next(iter(launches.values())), source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    key = f"pool-gradient-epilogue:{x.shape}:{x.dtype}:{digest}:{torch.cuda.get_device_name()}"
    return Step(op.name, "pooling", choices.Chooser(key, launches), source)


def _pooling_mode(options: dict) -> str:
    """Option `max_pooling`: "measure" (the default: on CUDA the faster of torch's pooling and the rows kernel,
    and of the two gradient kernels; under the interpreter torch's pooling and the per-window gradient),
    "windows" (those two everywhere) or "rows" (the rows kernels wherever they fit)."""
    mode = options.get("max_pooling", "measure")
    if mode not in ("measure", "windows", "rows"):
        raise CompileError(f"option max_pooling expects 'measure', 'windows' or 'rows', got {mode!r}")
    return mode


def _max_pool_run(op: Operation, x, into: int, out: int, backend: str, options: dict):
    """A max pooling of slot `into` into slot `out`: torch's (the reference call), or for 2x2 windows that
    tile the input the rows kernel (codegen/pooling.py), as option `max_pooling` says; and its source."""
    reference = ReferenceCall(lookup(op.op).impl, [into], [out], op.attrs)
    mode = _pooling_mode(options)
    if mode == "windows" or not _template_applies(mode, backend) or \
            not (x.dtype.is_floating and pooling.rows_fit(op.attrs, x.shape)):
        return reference, ""
    src = pooling.max_pool_rows(f"{op.name}_rows", x.shape, x.dtype, backend == "interpret")
    y = op.outputs[0]
    launch = FreshOutputs(KernelLaunch(src, [into], [out]), [into], [(out, y.shape, y.dtype.torch)], reference)
    if mode == "rows":
        return launch, src.source
    digest = hashlib.sha256(src.source.encode()).hexdigest()[:16]
    key = f"max-pooling:{x.shape}:{x.dtype}:{digest}:{torch.cuda.get_device_name()}"
    return choices.Chooser(key, {"library": reference, "rows": launch}), src.source


def _pool_output(pool: tuple[int, Operation] | None, outs: list[int], slots: dict, backend: str, options: dict):
    """(output index, pooling op, its run after the kernel, its output slot) for `_convolution_step`, or None."""
    if pool is None:
        return None
    i, op = pool
    out = slots[op.outputs[0].id]
    return i, op, _max_pool_run(op, op.inputs[0], outs[i], out, backend, options)[0], out


def _convolution_step(op: Operation, contraction: Operation, body: Program | None, layouts: list[Layout],
                      ins: list[int], outs: list[int], library, backend: str, options: dict, kind: str,
                      library_source: str | None = None, pool=None, twin: dict | None = None) -> Step:
    """A convolution (with its epilogue, or a stride-1 transposed convolution alone) as the library call
    `library`, as the Triton convolution template (codegen/convolution.py), or, on CUDA, the faster of the two
    measured on the first run. Option `conv_template`: "measure" (the default: measured on CUDA, the library
    under the interpreter), "triton" (the template wherever it applies) or "library"."""
    mode = _template_mode(options, backend)
    twin = dict(twin or {})  # the library call with channels-last operands (`_channels_last_twin`)
    if pool is not None:  # with a pooling of an output (`_pooled_convolutions`): the library call pools after it
        library = Chain(library, pool[2])
        twin = {name: Chain(run, pool[2]) for name, run in twin.items()}
    key = convolution.key(contraction, contraction.outputs[0].dtype, options)
    library_alone = _measured(op.name, kind, key, library, twin, library_source or "", "measure") if twin else \
        Step(op.name, kind, library, library_source)
    if mode is None or convolution.unsupported(contraction):
        return library_alone
    launches, sources = {}, []
    forms = [(variant, True) for variant in convolution.variants(contraction)] if mode == "measure" else [({}, True)]
    if pool is not None and mode == "measure":  # the template pooling in registers (two ways), and pooling after it
        cells = [({**forms[0][0], "conv_pool": "cells"}, True)] if pool[1].attrs["kernel_size"][1] <= 2 else []
        forms = forms[:1] + cells + [(variant, False) for variant, _ in forms]
    for variant, pooling_inside in forms:
        inside = pool is not None and pooling_inside
        try:
            src = convolution.generate(op.name, body, layouts, backend == "interpret", {**options, **variant},
                                       contraction=None if body is not None else contraction,
                                       pool=(pool[0], tuple(pool[1].attrs["kernel_size"])) if inside else None)
        except NotImplementedError as e:  # an epilogue the template has no form for: the library call alone
            log.info("kernel %s stays the library call: %s", op.name, e)
            return library_alone
        if inside:  # the pooled result has memory of its own, as the pooling's library call gives it
            pooled = pool[1].outputs[0]
            launch = FreshOutputs(KernelLaunch(src, ins, outs + [pool[3]]), ins[:1],
                                  [(pool[3], pooled.shape, pooled.dtype.torch)], library)
        elif pool is not None:
            launch = Chain(KernelLaunch(src, ins, outs), pool[2])
        else:
            launch = KernelLaunch(src, ins, outs)
        if body is None:  # an op that is otherwise a library call: its result has memory of its own
            out = contraction.outputs[0]
            launch = FreshOutputs(launch, ins[:2], [(outs[0], out.shape, out.dtype.torch)], library)
        launches[_variant_name(variant, pool is not None and not inside)] = launch
        sources.append(src.source)
    if mode == "measure":
        launches |= twin
    return _measured(op.name, kind, key, library, launches, "".join(sources) + (library_source or ""), mode)


def _variant_name(variant: dict, pooling_after: bool = False) -> str:
    """A template candidate's name in a measured choice: "triton", its variant's values, "+pooling" when the
    pooling runs after the kernel."""
    values = ("x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in variant.values())
    return "-".join(["triton", *values]) + ("+pooling" if pooling_after else "")


def _measured(name: str, kind: str, key: str, library, launches: dict, source: str, mode: str) -> Step:
    """The template's launch (option conv_template "triton": the first variant) or the fastest of the
    library call and the template's variants (`launches`, by name)."""
    if mode == "triton":
        return Step(name, "convolution", next(iter(launches.values())), source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    key = f"conv-template:{key}:{digest}:{torch.cuda.get_device_name()}"
    return Step(name, kind, choices.Chooser(key, {"library": library} | launches), source)


def _template_mode(options: dict, backend: str) -> str | None:
    """How option `conv_template` applies here: "triton", "measure", or None (the library call alone; always
    on a backend that runs no Triton kernels: the native CPU backend's convolutions are its own)."""
    mode = options.get("conv_template", "measure")
    if mode not in ("measure", "triton", "library"):
        raise CompileError(f"option conv_template expects 'measure', 'triton' or 'library', got {mode!r}")
    if mode == "library" or not _template_applies(mode, backend):
        return None
    return mode


def _template_applies(mode, backend: str) -> bool:
    """Whether a generated kernel that an option's `mode` asks for runs on `backend`: a measured choice
    ("measure") on CUDA alone, a forced one wherever Triton kernels run (CUDA or the interpreter); never on
    the native CPU or reference backends, whose kernels are their own."""
    return backend == "triton" or backend == "interpret" and mode != "measure"


def _weights_gradient_step(op: Operation, layouts: list[Layout], ins: list[int], outs: list[int], library,
                           backend: str, options: dict, new_slot, twin: dict | None = None) -> Step:
    """A convolution's weights gradient as the library call or the template's split product and the sum of
    its slices (codegen/convolution.py), as option `conv_template` says (see `_convolution_step`)."""
    mode, out, twin = _template_mode(options, backend), op.outputs[0], twin or {}
    key = convolution.key(op, out.dtype, options)
    library_alone = _measured(op.name, "vendor", key, library, twin, "", "measure") if twin else \
        Step(op.name, "vendor", library)
    if mode is None:
        return library_alone
    launches, sources = {}, []
    for variant in convolution.weights_variants(op) if mode == "measure" else [{}]:
        try:
            src = convolution.weights_gradient(op.name, op, layouts, backend == "interpret", {**options, **variant})
        except NotImplementedError as e:
            log.info("%s stays the library call: %s", op.name, e)
            return library_alone
        part = new_slot()
        run = Workspace([(part, (src.scratch,), torch.float32)], ins[0],
                        Chain(KernelLaunch(src.partial, ins, [part]), KernelLaunch(src.finish, [part], outs)))
        launches[_variant_name(variant)] = FreshOutputs(run, ins[:2], [(outs[0], out.shape, out.dtype.torch)], library)
        sources.append(src.partial.source + src.finish.source)
    if mode == "measure":
        launches |= twin
    return _measured(op.name, "vendor", key, library, launches, "".join(sources), mode)


def _recurrent_step(op: Operation, template: str, plan, ins: list[int], outs: list[int], interpret: bool,
                    options: dict, flags: tuple[list[Operation], int]) -> Step:
    """An LSTM cell or a product's arg maximum (passes/recurrent.py): one kernel; a gather it reads in place
    flags an index out of range."""
    body = op.attrs["body"]
    checks, flag_slot = flags
    if template == "lstm_cell":
        src = lstm.generate(op.name, body.notes["lstm_cell"], _layouts(op, plan), op.outputs[0].shape[0],
                            op.outputs[0].shape[1], op.outputs[0].dtype.name, interpret, options)
        flagged = tuple(o for o in body.operations if o.op == "gather")
    else:
        src = product_argmax.generate(op.name, body, _layouts(op, plan), interpret, options)
        flagged = src.checks
    checks.extend(flagged)
    return Step(op.name, template, KernelLaunch(src, ins, outs + ([flag_slot] if flagged else [])), src.source)


def _generation_step(op: Operation, plan, ins: list[int], outs: list[int], interpret: bool, options: dict,
                     flags: tuple[list[Operation], int], new_slot) -> Step:
    """Both LSTM layers and the draw of a token (passes/recurrent.py "lstm_step"): one persistent kernel, or
    its three stages; its sync words and partial rows live in a workspace of the step's own."""
    body = op.attrs["body"]
    checks, flag_slot = flags
    notes = body.notes["lstm_step"]
    h = op.outputs[0]
    src = lstm_step.generate(op.name, body, _layouts(op, plan), h.shape[1], h.shape[0], notes["sm_count"],
                             notes["persistent"], interpret, options)
    checks.extend(src.checks)
    checks.append(op)  # a barrier that timed out (its message: the body's notes["flagged"])
    sync, partial = new_slot(), new_slot()
    run = Chain(*(KernelLaunch(s, ins, outs + [partial, sync, flag_slot]) for s in src.stages))
    workspace = [(sync, (lstm_step.SYNC_WORDS,), torch.int32),
                 (partial, (src.partials,), getattr(torch, src.partial_dtype))]
    return Step(op.name, "lstm_step", Workspace(workspace, ins[0], run), src.stages[0].source)


def _prologue_step(op: Operation, plan, ins: list[int], outs: list[int], scratch: int | None, backend: str,
                   options: dict, flags, new_slot) -> Step:
    """A matmul kernel whose body computes an operand (passes/prologue.py): the Triton kernel that
    computes it as it loads the tiles, or the producers' kernels, the vendor GEMM and the epilogue, or
    (CUDA) the fastest of those and the Triton kernel with wider tiles, measured on the first run."""
    interpret = backend == "interpret"
    mode = prologue_mode(backend, options)
    body = op.attrs["body"]
    fused = None
    if mode != "separate":
        src = matmul.generate(op.name, body, _layouts(op, plan), interpret, options)
        fused = KernelLaunch(src, ins, outs)
        if mode == "fused":
            return Step(op.name, "matmul", fused, src.source)
    separate, sources = _separate_run(op, plan, ins, outs, scratch, interpret, options, flags, new_slot)
    if fused is None:
        return Step(op.name, "matmul", separate, sources)
    product = matmul.split(body).contraction
    a, b = product.inputs
    candidates = {"triton-prologue": fused}
    m, n = product.outputs[0].shape[-2:]
    for tiles in matmul.more_blocks(m, n, product.outputs[0].dtype.name):
        wide = matmul.generate(op.name, body, _layouts(op, plan), interpret, {**options, "matmul_blocks": tiles})
        candidates[f"triton-prologue-{tiles[0]}x{tiles[1]}"] = KernelLaunch(wide, ins, outs)
    candidates["vendor+separate-prologue"] = separate
    digest = hashlib.sha256(src.source.encode()).hexdigest()[:16]
    key = f"matmul-prologue:{a.shape}x{b.shape}:{a.dtype}:{digest}:{torch.cuda.get_device_name()}"
    return Step(op.name, "matmul", choices.Chooser(key, candidates), src.source + sources)


def _separate_run(op: Operation, plan, ins: list[int], outs: list[int], scratch: int, interpret: bool, options: dict,
                  flags, new_slot) -> tuple[Carve, str]:
    """The producers' ops as pointwise kernels writing temporaries in the kernel's scratch, the vendor GEMM
    on them (through the transpose the body reads them with), then the epilogue kernel."""
    checks, flag_slot = flags
    body = op.attrs["body"]
    parts = matmul.split(body)
    placeholders = [o.outputs[0] for o in body.operations if o.op == "placeholder"]
    layouts = _layouts(op, plan)
    spans, _ = separate_scratch(body)
    spans = iter(spans)
    steps, carved, operands, sources = [], [], [], []
    for j, (t, pro) in enumerate(zip(parts.contraction.inputs, parts.prologues)):
        if pro is None:
            operands.append(ins[placeholders.index(t)])
            continue
        program, leaves = _standalone(pro.ops, pro.value)
        src = pointwise.generate(f"{op.name}_prologue{j}", program, [layouts[placeholders.index(x)] for x in leaves],
                                 interpret, options)
        part = new_slot()
        carved.append((part, *next(spans), pro.value.dtype.torch, pro.value.shape))
        steps.append(KernelLaunch(src, [ins[placeholders.index(x)] for x in leaves], [part]))
        sources.append(src.source)
        if pro.view is not None:
            seen = new_slot()
            steps.append(ViewOf(lookup(pro.view.op).impl, part, seen, pro.view.attrs))
            part = seen
        operands.append(part)
    contraction, epi, used, _, epi_layouts = _split_contraction(op, plan)
    if epi is None:
        steps.append(_precision(VendorCall(lookup(contraction.op).vendor, operands, outs[0],
                                           _library_attrs(contraction, options)), options))
    else:
        product = new_slot()
        shape = contraction.outputs[0].shape
        carved.append((product, *next(spans), contraction.outputs[0].dtype.torch, shape))
        src = _generate(op.name, "pointwise", epi, epi_layouts, interpret, {**options, "first_check": len(checks)})
        checks.extend(src.checks)
        steps.append(_precision(VendorCall(lookup(contraction.op).vendor, operands, product,
                                           _library_attrs(contraction, options)), options))
        steps.append(KernelLaunch(src, [product] + [ins[i] for i in used], outs + ([flag_slot] if src.checks else [])))
        sources.append(src.source)
    return Carve(scratch, carved, Chain(*steps)), "".join(sources)


def _standalone(ops: list[Operation], value) -> tuple[Program, list]:
    """`ops` (computing `value`) as a program of their own, and the tensors its placeholders stand for."""
    g = Graph("prologue")
    mapping, leaves = {}, []
    for o in ops:
        for t in o.inputs:
            if t.id not in mapping and t.op.op == "placeholder":
                mapping[t.id] = g.placeholder(t.shape, t.dtype)
                leaves.append(t)
        for old, new in zip(o.outputs, copy_op(g, o, [mapping[t.id] for t in o.inputs])):
            mapping[old.id] = new
    return Program(g, [mapping[value.id]]), leaves


def _native_step(op: Operation, plan, ins: list[int], outs: list[int], scratch_slots: dict, flags,
                 options: dict) -> Step:
    """A fusion as a C++ loop nest (codegen/cpu.py) compiled with the executable's other kernels; its
    reference implementation when the C++ generator has no form for it or it does not compile (the
    reason is logged)."""
    module = options["native_module"]
    body, template = op.attrs["body"], op.attrs["template"]
    checks, flag_slot = flags
    reference = ReferenceCall(lookup(op.op).impl, ins, outs, op.attrs, into=True)
    try:
        if template == "pointwise" or template == "reduction" and cpu.fits(body):
            gen = cpu.pointwise if template == "pointwise" else cpu.reduction
            src = gen(op.name, body, _layouts(op, plan), len(checks))
            module.add(src)
            run = cpu.NativeLaunch(module, src, ins, outs + ([flag_slot] if src.checks else []), reference)
            checks.extend(src.checks)
            return Step(op.name, template, run, src.source)
        if template in ("pointwise", "reduction"):
            raise NotImplementedError(f"its rows need more than {cpu.MAX_SCRATCH} scratch elements per thread")
        contraction, epi, used, placeholders, layouts = _split_contraction(op, plan)
        vendor = _vendor(contraction, placeholders, ins, outs[0] if epi is None else scratch_slots[op.id], options,
                         native=True)
        direct = ""  # the direct convolution's source, shown with the kernel's
        fused = cpu_window.fused_epilogue(epi, layouts) if epi is not None and \
            cpu_window.direct_convolution_fits(contraction) else None
        if fused is not None:  # the epilogue ends the loop nest's own kernel: one kernel, no product buffer
            slots = [ins[placeholders.index(t)] for t in contraction.inputs] + [ins[i] for i in used]
            body_layouts = _layouts(op, plan)
            src = cpu_window.direct_convolution(f"{op.name}_direct", contraction,
                                                [body_layouts[placeholders.index(t)] for t in contraction.inputs],
                                                fused)
            module.add(src)
            return Step(op.name, template, cpu.NativeLaunch(module, src, slots, outs, reference), src.source)
        if cpu_window.direct_convolution_fits(contraction):
            vendor, direct = _direct_convolution(op, contraction, plan, placeholders, ins, vendor, module,
                                                 epi is not None)
        if epi is None:
            return Step(op.name, template, vendor, direct or None)
        tmp = scratch_slots[op.id]
        src = cpu.pointwise(op.name, epi, layouts, len(checks))
        module.add(src)
        launch = cpu.NativeLaunch(module, src, [tmp] + [ins[i] for i in used],
                                  outs + ([flag_slot] if src.checks else []), reference)
        checks.extend(src.checks)
        return Step(op.name, template, Chain(vendor, launch), direct + src.source)
    except NotImplementedError as e:
        log.info("kernel %s runs through its reference implementation on the CPU: %s", op.name, e)
        return Step(op.name, "reference", reference)


def _direct_convolution(op: Operation, contraction: Operation, plan, placeholders, ins: list[int], vendor: VendorCall,
                        module: cpu.Module, own_buffer: bool) -> tuple:
    """A small convolution as the native direct loop nest (codegen/cpu_window.py) writing the slot the library
    call would bind (the library call when it does not compile): the kernel's planned output, or (with
    `own_buffer`, the product an epilogue reads) a buffer of its own."""
    body_layouts = _layouts(op, plan)
    slots = [ins[placeholders.index(t)] for t in contraction.inputs]
    layouts = [body_layouts[placeholders.index(t)] for t in contraction.inputs]
    src = cpu_window.direct_convolution(f"{op.name}_direct", contraction, layouts)
    module.add(src)
    launch = cpu.NativeLaunch(module, src, slots, [vendor.out_slot], vendor)
    if own_buffer:
        product = contraction.outputs[0]
        return Chain(native_conv.BindBuffer(vendor.out_slot, product.shape, product.dtype.torch), launch), src.source
    return launch, src.source


def _cublaslt_epilogue(body: Program, contraction: Operation, placeholders, ins: list[int], outs: list[int]):
    """cuBLASLt runs bias, bias+ReLU and bias+GeLU(tanh) inside the GEMM: (kind, CublasLtCall) when the epilogue is
    exactly one of those on a 2-D product, else None."""
    product = contraction.outputs[0]
    a, b = contraction.inputs
    if a.rank != 2 or b.rank != 2 or product.dtype.name not in ("float16", "bfloat16", "float32") or \
            len(body.outputs) != 1:
        return None
    rest = [o for o in body.operations if o.op not in ("placeholder", "constant") and o is not contraction]
    first = rest[0]
    if first.op != "addition" or product not in first.inputs:
        return None
    bias = first.inputs[1] if first.inputs[0] is product else first.inputs[0]
    if bias.op.op != "placeholder" or bias.shape not in ((product.shape[1],), (1, product.shape[1])):
        return None
    tail = rest[1:]
    gelu_input = first.outputs[0]
    if len(tail) > 2 and tail[0].op == "cast" and tail[0].inputs[0] is gelu_input and \
            tail[0].attrs["dtype"].name == "float32" and tail[-1].op == "cast" and \
            tail[-1].attrs["dtype"].name == product.dtype.name:
        # a half-type GeLU computes in float32 between two casts (composites.gelu); cuBLASLt's epilogue
        # computes in float32 too and rounds once to the product's type
        gelu_input, gelu = tail[0].outputs[0], tail[1:-1]
    else:
        gelu = tail
    if not tail:
        kind = "bias"
    elif len(tail) == 1 and tail[0].op == "relu" and tail[0].inputs[0] is first.outputs[0]:
        kind = "bias_relu"
    elif _dataflow(gelu, gelu_input) == _gelu_tanh():
        kind = "bias_gelu"
    else:
        return None
    if body.outputs[0] is not rest[-1].outputs[0]:
        return None
    ia, ib, ibias = (ins[placeholders.index(t)] for t in (a, b, bias))
    return kind, CublasLtCall(kind, ia, ib, ibias, outs[0])


def _dataflow(ops: list[Operation], source) -> list | None:
    """The ops as a pattern: per op its name and, per input, "x" (`source`), a constant's value, or
    (i, j) for output j of the i-th op; None when an op reads anything else."""
    made = {t.id: (i, j) for i, o in enumerate(ops) for j, t in enumerate(o.outputs)}
    pattern = []
    for o in ops:
        reads = []
        for t in o.inputs:
            if t is source:
                reads.append("x")
            elif t.id in made:
                reads.append(made[t.id])
            elif t.op.op == "constant":
                reads.append(t.op.attrs["value"].tolist())
            else:
                return None
        pattern.append((o.op, reads))
    return pattern


@functools.cache
def _gelu_tanh() -> list:
    """The float32 tanh GeLU exactly as composites.gelu builds it, as a `_dataflow` pattern: the form that
    cuBLASLt's GELU epilogue computes."""
    g = Graph("gelu_tanh")
    x = g.placeholder((1,), float32)
    g.gelu(x, approximate="tanh")
    return _dataflow([o for o in g.operations if o.op not in ("placeholder", "constant")], x)
