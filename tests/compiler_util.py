"""What the compiler tests share: inputs, compiled-versus-eager runs, result comparison, compiling
kernels for CUDA, and the sample graphs.

A sample graph is a `Case`: `build(g, feed)` builds ops on placeholders that `feed(shape, dtype)`
makes (it draws their values too) and returns the targets; `reference`, when given, computes the
targets independently in PyTorch from the feeds in float64. `run_case` compiles the graph for the
CPU (its kernels run under TRITON_INTERPRET=1), runs it, and runs the eager interpreter on the same
feeds; `check_case` holds both to the tolerance rule of tests/tolerance.py against the float64
reference (a kernel may be closer to float64 than eager, never further than the rule). The samples (`all_cases`) cover every elementwise primitive and cast,
every fusable reduction, the composites, matmul and convolution epilogues, views and opaque ops;
`opdb_cases` adds the op database's samples through `from_opdb`.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import stitchml as sm
from tolerance import allowed, assert_within, sensitivity

EXACT = (0.0, 0.0)
SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -2.5, 1.0)
WIDE_INTS = {sm.int32: (2**24 + 1, -(2**24) - 3, 2**31 - 1, -(2**31)), sm.int64: (2**53 + 1, -(2**40) - 7, 2**62)}


def values(rng: np.random.Generator, shape, dtype: sm.DType, low: float = -3.0, high: float = 3.0,
           specials: bool = False, nonzero: bool = False, wide: bool = False, integral: bool = False) -> torch.Tensor:
    """Values of `dtype` in [low, high); `specials` scatters NaN, infinities and signed zeros among
    float values; `wide` does the same with integers beyond float32's exact range; `integral` makes
    float values whole numbers (their sums are exact in any order)."""
    shape = tuple(shape)
    n = int(np.prod(shape))
    if dtype.is_bool:
        data = rng.random(shape) < 0.5
    elif dtype.is_integer:
        info = torch.iinfo(dtype.torch)
        lo, hi = max(math.floor(low), info.min), min(math.ceil(high), info.max)
        data = rng.integers(lo, hi, size=shape, endpoint=True)
        if nonzero:
            data[data == 0] = 1 if hi >= 1 else -1
        if wide and dtype in WIDE_INTS and n >= 8:
            extra = np.asarray(WIDE_INTS[dtype], np.int64)
            data.reshape(-1)[rng.permutation(n)[:len(extra)]] = extra
    else:
        data = rng.uniform(low, high, size=shape)
        if integral:
            data = np.round(data)
        if nonzero:
            data = np.where(np.abs(data) < 0.25, np.copysign(0.25, data), data)
        if specials and n >= 2 * len(SPECIALS):
            data.reshape(-1)[rng.permutation(n)[:len(SPECIALS)]] = SPECIALS
    return torch.as_tensor(np.asarray(data)).to(dtype.torch)


class Feeds(dict):
    """{placeholder: value} that builds as it goes: `feed(shape, dtype, ...)` returns a new placeholder.

    Keyword arguments are those of `values`.
    """

    def __init__(self, g: sm.Graph, rng: np.random.Generator):
        super().__init__()
        self.graph, self.rng = g, rng

    def __call__(self, shape, dtype: sm.DType = sm.float32, **kw) -> sm.Tensor:
        p = self.graph.placeholder(tuple(shape), dtype, name=f"in{len(self)}")
        self[p] = values(self.rng, shape, dtype, **kw)
        return p


@dataclass
class Case:
    """One sample graph; see the module docstring. `kernels`: how many kernels it must compile to."""

    name: str
    build: Callable[[sm.Graph, Feeds], list]
    reference: Callable[..., list] | None = None
    kernels: int | None = None
    tol: tuple | None = None  # EXACT for ops IEEE rounds alike everywhere: compiled equals eager bit for bit
    family: str = "graph"  # the op family of the tolerance rule (tests/tolerance.py)
    float_args: bool = False  # the reference takes integer feeds as float64 too (ops defined on floats)
    known_failure: str = ""  # why it fails today; the test then requires it to fail

    def __repr__(self) -> str:
        return self.name


@dataclass
class Outcome:
    graph: sm.Graph
    exe: object
    feeds: Feeds
    targets: list
    compiled: list[torch.Tensor]
    eager: list[torch.Tensor]


def seeded(name: str) -> np.random.Generator:
    """A generator seeded by a case's name: every run of the suite sees the same inputs."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def compile_case(case: Case, options: dict | None = None) -> tuple[sm.Graph, Feeds, list, object]:
    """The case's graph, feeds and targets, and its executable for the CPU."""
    g = sm.Graph(case.name)
    feeds = Feeds(g, seeded(case.name))
    targets = list(case.build(g, feeds))
    return g, feeds, targets, g.compile(feeds, targets, device="cpu", options=options)


def run_case(case: Case, options: dict | None = None) -> Outcome:
    g, feeds, targets, exe = compile_case(case, options)
    got = exe.run(feeds)
    want = g.run(feeds, targets, device="cpu")
    return Outcome(g, exe, feeds, targets, [got[t].torch() for t in targets], [want[t].torch() for t in targets])


def check_case(case: Case, options: dict | None = None) -> Outcome:
    """Compiled and eager both within the tolerance rule of the float64 reference (bit for bit equal
    where the case says EXACT; equal within the rule where it has no reference); the kernel count if given."""
    out = run_case(case, options)
    if case.reference is not None:
        args = [v.double() if v.dtype.is_floating_point or case.float_args else v for v in out.feeds.values()]
        refs = [torch.as_tensor(r) for r in case.reference(*args)]
        assert len(refs) == len(out.targets), f"{case.name}: the reference gives {len(refs)} results"
        scales = sensitivity(case.reference, args) if any(a.is_floating_point() for a in out.compiled) else []
        for i, (a, b, r) in enumerate(zip(out.compiled, out.eager, refs)):
            scale = scales[i] if i < len(scales) and scales[i] is not None \
                and tuple(scales[i][0].shape) == tuple(a.shape) else None
            assert_reference(a, r, f"{case.name}: target {i} compiled vs float64 reference", case.family, scale)
            assert_reference(b, r, f"{case.name}: target {i} eager vs float64 reference", case.family, scale)
    for i, (t, a, b) in enumerate(zip(out.targets, out.compiled, out.eager)):
        if case.tol is not None or case.reference is None or not a.dtype.is_floating_point:
            assert_match(a, b, f"{case.name}: target {i} ({t.name}) compiled vs eager", case.tol, family=case.family)
    if case.kernels is not None:
        assert out.exe.kernel_count == case.kernels, \
            f"{case.name}: {out.exe.kernel_count} kernels, expected {case.kernels}:\n{out.exe.fusion_report()}"
    return out


def assert_match(actual: torch.Tensor, expected: torch.Tensor, what: str, tol: tuple | None = None,
                 reference: torch.Tensor | None = None, family: str = "graph") -> None:
    """Same dtype and shape; integers and bools exactly equal; floats equal, NaN where `expected` has NaN
    and infinities alike, or within (rtol, atol) `tol`; without `tol`, within the tolerance rule of
    tests/tolerance.py for `family` taking `expected` as the reference, twice over (both sides round),
    and the largest finite element of `expected` as the size of the terms (a whole run has no autograd).

    With a float64 `reference`, a float element that misses may instead be within the rule of the
    reference: eager rounds half types after every op, kernels only where they store, so eager can
    lose digits (and overflow) where the kernel does not.
    """
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not actual.dtype.is_floating_point:
        wrong = (actual != expected).nonzero()
        assert len(wrong) == 0, (f"{what}: {len(wrong)} of {actual.numel()} elements differ, first at "
                                 f"{tuple(wrong[0].tolist())}: {actual[tuple(wrong[0])]} vs {expected[tuple(wrong[0])]}")
        return
    a, e = actual.double(), expected.double()
    if tol is None:
        finite = e[e.isfinite()].abs()
        reach = torch.full_like(e, finite.max().item() if finite.numel() else 0.0)
        terms = (torch.zeros_like(e), torch.ones_like(e), reach)
        limit = 2 * allowed(sm.as_dtype(actual.dtype), family, e, terms)
        rule = f"the tolerance rule ({family}) around expected, twice"
    else:
        limit = tol[1] + tol[0] * e.abs()
        rule = f"rtol {tol[0]:g}, atol {tol[1]:g}"
    ok = (a == e) | (a.isnan() & e.isnan()) | (e.isfinite() & ((a - e).abs() <= limit))
    if reference is not None:
        r = reference.double()
        ok |= r.isfinite() & ((a - r).abs() <= allowed(sm.as_dtype(actual.dtype), family, r))
    wrong = (~ok).nonzero()
    if len(wrong):
        shown = [(tuple(w.tolist()), a[tuple(w)].item(), e[tuple(w)].item()) for w in wrong[:4]]
        raise AssertionError(f"{what}: {len(wrong)} of {a.numel()} elements differ beyond {rule}; "
                             f"(index, actual, expected): {shown}")


def assert_reference(actual: torch.Tensor, reference: torch.Tensor, what: str, family: str = "graph",
                     scale: tuple | None = None) -> None:
    """`actual` within the tolerance rule (tests/tolerance.py) of a reference computed in float64 from the
    same inputs (exactly equal for integer and bool results); `scale` from `tolerance.sensitivity`."""
    assert_within(actual, reference, family, what, scale)


# -- kernels compiled for CUDA ---------------------------------------------------------------
_POINTERS = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "int8": "*i8",
             "uint8": "*u8", "int16": "*i16", "int32": "*i32", "int64": "*i64", "bool": "*i1",
             "uint16": "*u16", "uint32": "*u32", "uint64": "*u64"}


def compile_for_cuda(jobs: list[str], workdir: pathlib.Path) -> dict[str, str]:
    """Compile kernels for sm_90 in a fresh process; returns {job: error} for those that fail.

    A job is a JSON object: kernel name, source, dtypes of the pointer arguments, the extents passed after
    them, constexprs, warps and optionally stages.
    A process of its own, because Triton's interpreter leaves `triton.language` patched after a kernel
    calls another jitted function (tl.sigmoid, our _maximum...), which breaks later compiles.
    """
    (workdir / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(workdir / "triton"), STITCHML_CACHE_DIR=str(workdir / "stitchml"),
               TRITON_DEFAULT_FP_FUSION="1")
    code = f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); import compiler_util; " \
           f"compiler_util._compile_jobs({str(workdir)!r})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return json.loads((workdir / "failed.json").read_text())


def _compile_jobs(workdir: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from stitchml.runtime import loader

    failed = {}
    for text in json.loads(pathlib.Path(workdir, "jobs.json").read_text()):
        job = json.loads(text)
        fn = loader.load(job["name"], job["source"])
        signature = {name: _POINTERS[dt] for name, dt in zip(fn.arg_names, job["dtypes"])}
        extents = fn.arg_names[len(job["dtypes"]):len(job["dtypes"]) + len(job.get("sizes", ()))]
        signature.update({name: "i32" if abs(v) < 2**31 else "i64" for name, v in zip(extents, job.get("sizes", ()))})
        signature.update({name: "constexpr" for name in job["constexprs"]})
        try:
            stages = {"num_stages": job["stages"]} if job.get("stages") else {}
            triton.compile(ASTSource(fn, signature, constexprs=job["constexprs"]), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": job["warps"], **stages})
        except Exception as e:  # noqa: BLE001  (any failure to compile is the finding)
            failed[text] = f"{job['name']}: {type(e).__name__}: " + " ".join(str(e).split())[-300:]
    pathlib.Path(workdir, "failed.json").write_text(json.dumps(failed))


# -- the sample graphs ------------------------------------------------------------------------
FLOATS = (sm.float32, sm.float16, sm.bfloat16, sm.float64)
ELEMENTWISE_DTYPES = FLOATS + (sm.int32, sm.int64, sm.int8, sm.uint8, sm.bool)
OPERAND_DTYPES = {"select": {0: sm.bool}}
SHAPES = {1: [(4, 9)], 2: [(4, 1), (9,)], 3: [(4, 1), (4, 9), (9,)]}  # every operand broadcasts somewhere


def operands(name: str) -> int:
    """How many tensor operands the builder of primitive `name` takes."""
    import inspect

    from stitchml.registry import BUILDERS

    return len(inspect.signature(BUILDERS[name]).parameters) - 2  # minus the graph and `name`


def _builds(build: Callable) -> bool:
    """Whether the builder accepts these operands (a ShapeError is the op's contract, not the compiler's)."""
    g = sm.Graph()
    try:
        build(g, Feeds(g, np.random.default_rng(0)))
    except sm.ShapeError:
        return False
    return True


def _elementwise(name: str, dtype: sm.DType) -> Case:
    from opdb import OPS
    from stitchml.registry import lookup

    record = OPS[name]
    domains, nonzero = record.domains, record.nonzero

    def build(g, feed):
        args = []
        for i, shape in enumerate(SHAPES[operands(name)]):
            low, high = domains[i] if i < len(domains) else (-3.0, 3.0)
            dt = OPERAND_DTYPES.get(name, {}).get(i, dtype)
            args.append(feed(shape, dt, low=low, high=high, specials=dt.is_floating, nonzero=nonzero == i,
                             wide=not domains))
        return [getattr(g, name)(*args)]

    impl = lookup(name).impl
    return Case(f"{name}-{dtype}", build, (lambda *xs: [impl(*xs)]) if dtype.is_floating else None,
                tol=EXACT if record.bit_exact else None,
                family=record.family)


def _cast(src: sm.DType, dst: sm.DType) -> Case:
    # Float to integer conversion of NaN, infinities or values out of range is undefined: not sampled.
    low, high = {sm.int8: (-100, 100), sm.uint8: (0, 200)}.get(dst, (-1000, 1000)) if dst.is_integer else (-300, 300)

    def build(g, feed):
        return [g.cast(feed((4, 9), src, low=low, high=high, specials=not dst.is_integer, wide=True), dst)]

    return Case(f"cast-{src}-{dst}", build, lambda x: [x.to(dst.torch)], tol=EXACT, family="elementwise")


def elementwise_cases() -> list[Case]:
    """Every elementwise primitive of the registry, in every dtype its builder accepts."""
    from stitchml.registry import ELEMENTWISE, REGISTRY

    cases = [_elementwise(name, dt) for name, prim in REGISTRY.items() if prim.kind == ELEMENTWISE and name != "cast"
             for dt in ELEMENTWISE_DTYPES]
    cases = [c for c in cases if _builds(c.build)]
    return cases + [_cast(a, b) for a in ELEMENTWISE_DTYPES for b in ELEMENTWISE_DTYPES]


REDUCTION_AXES = [(None, False), ((0,), True), ((1,), False), ((2,), True), ((0, 2), False), ((-1,), False),
                  ((1, 2), True)]
def _product(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(dim=d, keepdim=keep)
    return x


_TORCH_REDUCTIONS = {
    "reduction_sum": lambda x, d, k: x.sum(dim=d, keepdim=k),
    "reduction_mean": lambda x, d, k: x.mean(dim=d, keepdim=k),
    "reduction_maximum": lambda x, d, k: x.amax(dim=d, keepdim=k),
    "reduction_minimum": lambda x, d, k: x.amin(dim=d, keepdim=k),
    "reduction_product": lambda x, d, k: _product(x, d, k),
}


def reduction_cases() -> list[Case]:
    """Every fusable reduction over a (3, 4, 9) frame: several axis sets (inner, outer, both), keep_dims
    on and off, in every float type and int32 and bool."""
    from stitchml.passes.legality import FUSABLE_REDUCTIONS

    cases = []
    for name in sorted(FUSABLE_REDUCTIONS):
        for dt in FLOATS + (sm.int32, sm.bool):
            for axes, keep in REDUCTION_AXES if dt == sm.float32 else REDUCTION_AXES[::3]:
                low, high = (0.5, 1.5) if name == "reduction_product" else (-2.0, 2.0)

                def build(g, feed, name=name, dt=dt, axes=axes, keep=keep, low=low, high=high):
                    return [getattr(g, name)(feed((3, 4, 9), dt, low=low, high=high, specials=dt.is_floating),
                                             axes, keep_dims=keep)]

                def reference(x, name=name, axes=axes, keep=keep):
                    dims = tuple(range(3)) if axes is None else tuple(sorted(a % 3 for a in axes))
                    return [_TORCH_REDUCTIONS[name](x, dims, keep)]

                cases.append(Case(f"{name}-{dt}-{axes}-{'keep' if keep else 'drop'}", build,
                                  reference if dt.is_floating else None, kernels=1, family="reduction"))
    return [c for c in cases if _builds(c.build)]


def _per_float(name: str, build, reference, kernels: int | None = None, shape=(4, 9)) -> list[Case]:
    """One case per float type of a composite `build(g, x)` on a placeholder x of `shape`."""
    return [Case(f"{name}-{dt}", lambda g, feed, dt=dt: list(build(g, feed(shape, dt))), reference, kernels,
                 family="composite") for dt in FLOATS]


def composite_cases() -> list[Case]:
    """Composites: the activations fuse into one pointwise kernel, the softmax family and the
    normalizations into one reduction kernel each."""
    F = torch.nn.functional
    gamma, beta = np.linspace(0.5, 1.5, 9), np.linspace(-0.25, 0.25, 9)  # steps every half type holds exactly

    def layer_norm(g, x):
        return [g.layer_normalization(x, -1, gamma=g.cast(g.constant(gamma), x.dtype),
                                      beta=g.cast(g.constant(beta), x.dtype))]

    cases = [
        *_per_float("gelu", lambda g, x: [g.gelu(x)], lambda x: [F.gelu(x)], 1),
        *_per_float("gelu_tanh", lambda g, x: [g.gelu(x, "tanh")], lambda x: [F.gelu(x, approximate="tanh")], 1),
        *_per_float("silu", lambda g, x: [g.silu(x)], lambda x: [F.silu(x)], 1),
        *_per_float("softplus", lambda g, x: [g.softplus(x * 8.0)], lambda x: [F.softplus(x * 8.0)], 1),
        *_per_float("leaky_relu", lambda g, x: [g.leaky_relu(x)], lambda x: [F.leaky_relu(x, 0.01)], 1),
        *_per_float("softmax", lambda g, x: [g.softmax(x)], lambda x: [torch.softmax(x, -1)], 1),
        *_per_float("softmax_axis0", lambda g, x: [g.softmax(x, 0)], lambda x: [torch.softmax(x, 0)], 1),
        *_per_float("log_softmax", lambda g, x: [g.log_softmax(x)], lambda x: [torch.log_softmax(x, -1)], 1),
        # Two: the composite drops the kept axis with a maximum over it, a reduction of another frame.
        *_per_float("log_sum_exp", lambda g, x: [g.log_sum_exp(x)], lambda x: [torch.logsumexp(x, -1)], 2),
        *_per_float("variance", lambda g, x: [g.variance(x, (1,))], lambda x: [x.var(1, unbiased=False)], 1),
        *_per_float("variance_all", lambda g, x: [g.variance(x)], lambda x: [x.var(unbiased=False)], 1),
        *_per_float("layer_norm", layer_norm,
                    lambda x: [F.layer_norm(x, (9,), torch.tensor(gamma), torch.tensor(beta), 1e-5)], 1),
        *_per_float("batch_norm", lambda g, x: [g.batch_normalization(x)],
                    lambda x: [F.batch_norm(x, None, None, training=True, eps=1e-5)], 1, shape=(2, 3, 4, 5)),
        Case("softmax_cross_entropy_rows",
             lambda g, feed: [g.softmax_cross_entropy(feed((4, 9)), feed((4, 9), low=0.0, high=1.0), reduction="none")],
             lambda x, p: [-(p * torch.log_softmax(x, -1)).sum(-1)], kernels=1, family="composite"),
        Case("softmax_cross_entropy_labels",
             lambda g, feed: [g.softmax_cross_entropy(feed((4, 9)), feed((4,), sm.int32, low=0, high=8),
                                                      reduction="mean")],
             lambda x, labels: [F.cross_entropy(x, labels.long())], family="composite"),
        Case("normalization",
             lambda g, feed: [g.normalization(feed((4, 9)), feed((1, 9)), feed((1, 9), low=0.1, high=2.0),
                                              feed((9,)), feed((9,)))],
             lambda x, m, v, gm, b: [(x - m) / torch.sqrt(v + 1e-5) * gm + b], kernels=2, family="composite"),
        Case("lstm_cell", _lstm, _lstm_reference),  # its matrix products round: a graph
    ]
    return cases


def _lstm(g, feed):
    x, h, c = feed((3, 5)), feed((3, 4)), feed((3, 4))
    return list(g.lstm_cell(x, h, c, feed((16, 5), low=-0.5, high=0.5), feed((16, 4), low=-0.5, high=0.5),
                            feed((16,))))


def _lstm_reference(x, h, c, w_ih, w_hh, b):
    i, f, gg, o = (x @ w_ih.T + h @ w_hh.T + b).chunk(4, -1)
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
    return [torch.sigmoid(o) * torch.tanh(c2), c2]


def contraction_cases() -> list[Case]:
    """Matrix products and convolutions, alone and with the elementwise epilogue fused into their kernel."""
    F = torch.nn.functional
    conv = sm.Convolution2DDescriptor(stride=2, padding=1)
    nhwc = sm.Convolution2DDescriptor(padding="same", data_layout="NHWC", weights_layout="HWIO")
    cases = []
    for dt in (sm.float32, sm.float16, sm.float64):
        cases += [
            Case(f"matmul-{dt}", lambda g, feed, dt=dt: [feed((4, 8), dt) @ feed((8, 6), dt)], lambda a, b: [a @ b], 1),
            Case(f"matmul_bias_gelu-{dt}",
                 lambda g, feed, dt=dt: [g.gelu(feed((4, 8), dt) @ feed((8, 6), dt) + feed((6,), dt))],
                 lambda a, b, c: [F.gelu(a @ b + c)], 1),
        ]
    cases += [
        Case("matmul_bias_relu", lambda g, feed: [g.relu(feed((4, 8)) @ feed((8, 6)) + feed((6,)))],
             lambda a, b, c: [torch.relu(a @ b + c)], 1),
        Case("matmul_batched_bias", lambda g, feed: [feed((2, 4, 8)) @ feed((8, 6)) * 0.5 + feed((4, 1))],
             lambda a, b, c: [(a @ b) * 0.5 + c], 1),
        Case("matmul_transposed_operand", lambda g, feed: [g.transpose(feed((8, 4)), [1, 0]) @ feed((8, 6))],
             lambda a, b: [a.T @ b], 1),
        Case("matmul_int_operands", lambda g, feed: [feed((4, 8), sm.int32) @ feed((8, 6), sm.int32)],
             lambda a, b: [(a.double() @ b.double())]),
        Case("matmul_vector", lambda g, feed: [g.exponent(feed((8,)) @ feed((8, 6)))],
             lambda a, b: [torch.exp(a @ b)]),
        Case("matmul_then_softmax", lambda g, feed: [g.softmax(feed((4, 8)) @ feed((8, 6)))],
             lambda a, b: [torch.softmax(a @ b, -1)], 2),
        Case("matmul_epilogue_two_outputs", lambda g, feed: _two_outputs(g, feed((4, 8)) @ feed((8, 6))),
             lambda a, b: [torch.tanh(a @ b), torch.tanh(a @ b) * 2.0]),
        Case("conv_bias_relu",
             lambda g, feed: [g.relu(g.convolution2d(feed((2, 3, 6, 6)), feed((4, 3, 3, 3))) + feed((4, 1, 1)))],
             lambda x, w, b: [torch.relu(F.conv2d(x, w) + b)], 1),
        Case("conv_stride_padding",
             lambda g, feed: [g.convolution2d(feed((2, 3, 7, 7)), feed((4, 3, 3, 3)), conv) * 2.0],
             lambda x, w: [F.conv2d(x, w, stride=2, padding=1) * 2.0], 1),
        Case("conv_nhwc", lambda g, feed: [g.sigmoid(g.convolution2d(feed((2, 5, 5, 3)), feed((3, 3, 3, 4)), nhwc))],
             lambda x, w: [torch.sigmoid(F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), padding=1)
                                         .permute(0, 2, 3, 1))], 1),
        Case("conv_nhwc_one_channel",
             lambda g, feed: [g.convolution2d(feed((2, 5, 5, 1)), feed((3, 3, 1, 3)), nhwc) + 1.0],
             lambda x, w: [F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), padding=1).permute(0, 2, 3, 1) + 1.0],
             1),
        Case("conv_transpose",
             lambda g, feed: [g.convolution_transpose2d(feed((2, 4, 3, 3)), feed((4, 3, 3, 3)), conv,
                                                        output_padding=(1, 1)) + 1.0],
             lambda x, w: [F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1) + 1.0]),
    ]
    return cases


def _two_outputs(g, y):
    t = g.tanh(y)
    return [t, t * 2.0]


def view_cases() -> list[Case]:
    """Views: read by kernels through strided loads, made from kernel outputs, copied where no view fits."""
    return [
        Case("transpose_into_kernel", lambda g, feed: [g.exponent(g.transpose(feed((4, 9)), [1, 0]))],
             lambda x: [torch.exp(x.T)], 1),
        Case("transpose3d_into_reduction", lambda g, feed: [g.reduction_sum(g.transpose(feed((3, 4, 5)), [2, 0, 1]), 1)],
             lambda x: [x.permute(2, 0, 1).sum(1)], 1),
        Case("slice_steps", lambda g, feed: [g.slice(feed((6, 9)), [1, 0], [None, 8], [2, 3]) + 1.0],
             lambda x: [x[1::2, 0:8:3] + 1.0], 1),
        Case("slice_negative_stride", lambda g, feed: [g.slice(feed((6, 9)), [None, 1], [None, 7], [-1, 2]) * 2.0],
             lambda x: [x.flip(0)[:, 1:7:2] * 2.0]),
        Case("broadcast_to", lambda g, feed: [g.broadcast_to(feed((1, 9)), (4, 9)) * feed((4, 1))],
             lambda a, b: [a * b], 1),
        Case("expand_squeeze_reshape",
             lambda g, feed: [g.reshape(g.squeeze(g.expand_dims(feed((4, 9)), [0]), [0]), (6, 6)) - feed((6, 6))],
             lambda a, b: [a.reshape(6, 6) - b], 1),
        Case("reshape_of_transpose", lambda g, feed: [g.reshape(g.transpose(feed((4, 9)), [1, 0]), (6, 6)) + 1.0],
             lambda x: [x.T.reshape(6, 6) + 1.0]),
        Case("view_of_kernel_output", lambda g, feed: [g.transpose(g.exponent(feed((4, 9))), [1, 0])],
             lambda x: [torch.exp(x).T], 1),
        Case("view_of_intermediate", lambda g, feed: [g.reduction_maximum(g.transpose(g.exponent(feed((4, 9))), [1, 0]), 0)],
             lambda x: [torch.exp(x).T.amax(0)]),
        Case("index", lambda g, feed: [g.index(feed((4, 9)), (slice(None, None, -2), 3)) * 3.0],
             lambda x: [x.flip(0)[::2, 3] * 3.0]),
    ]


def opaque_cases() -> list[Case]:
    """Ops that run through their reference implementation between kernels."""
    pool = sm.Pooling2DDescriptor(kernel_size=2)
    F = torch.nn.functional
    idx = torch.tensor([2, -1, 0, 2])
    return [
        Case("concat", lambda g, feed: [g.exponent(g.concat([g.sin(feed((4, 3))), feed((4, 5))], axis=1))],
             lambda a, b: [torch.exp(torch.cat([torch.sin(a), b], 1))]),
        Case("split", lambda g, feed: [p * float(i + 1) for i, p in enumerate(g.split(g.tanh(feed((4, 9))), [2, 7], 1))],
             lambda x: [p * float(i + 1) for i, p in enumerate(torch.tanh(x).split([2, 7], 1))]),
        Case("pad_constant", lambda g, feed: [g.pad(feed((4, 9)) * 2.0, [1, 0], [0, 2], constant_value=-1.0) + 1.0],
             lambda x: [F.pad(x * 2.0, (0, 2, 1, 0), value=-1.0) + 1.0]),
        Case("pad_reflect", lambda g, feed: [g.pad(feed((4, 9)), [0, 2], [0, 3], mode="reflect") * 2.0],
             lambda x: [F.pad(x[None], (2, 3), mode="reflect")[0] * 2.0]),
        Case("tile_reverse", lambda g, feed: [g.reverse(g.tile(feed((2, 3)), [2, 3]), [1]) + 1.0],
             lambda x: [x.repeat(2, 3).flip(1) + 1.0]),
        Case("gather", lambda g, feed: [g.gather(feed((3, 9)), g.constant(idx), 0) * 2.0],
             lambda x: [x[idx % 3] * 2.0]),
        Case("scatter_add", lambda g, feed: [g.scatter_add(feed((3, 4)), g.constant(torch.tensor([0, 2, 0])),
                                                            feed((3, 4)), 0) + 1.0],
             lambda d, u: [d.index_add(0, torch.tensor([0, 2, 0]), u) + 1.0]),
        Case("gather_along_axis", lambda g, feed: [g.gather_along_axis(feed((3, 4)), feed((3, 2), sm.int64, low=0, high=3), 1)],
             lambda x, i: [x.gather(1, i)]),
        Case("scatter_add_along_axis",
             lambda g, feed: [g.scatter_add_along_axis(feed((3, 4)), feed((3, 2), sm.int64, low=0, high=3),
                                                       feed((3, 2)), 1) * 2.0],
             lambda d, i, u: [d.scatter_add(1, i, u) * 2.0]),
        Case("one_hot", lambda g, feed: [g.one_hot(feed((5,), sm.int32, low=-1, high=3), 4) * 2.0],
             lambda i: [F.one_hot(i.long().clamp(min=0), 4).double() * (i >= 0).double()[:, None] * 2.0]),
        Case("arg_maximum", lambda g, feed: [g.reduction_arg_maximum(g.exponent(feed((4, 9))), 1)],
             lambda x: [x.argmax(1)]),
        Case("arg_minimum", lambda g, feed: [g.reduction_arg_minimum(feed((4, 9)), 0, keep_dims=True)],
             lambda x: [x.argmin(0, keepdim=True)]),
        Case("max_pooling", lambda g, feed: [g.max_pooling2d(g.relu(feed((2, 3, 6, 6))), pool) * 2.0],
             lambda x: [F.max_pool2d(torch.relu(x), 2) * 2.0]),
        Case("avg_pooling", lambda g, feed: [g.avg_pooling2d(feed((2, 3, 6, 6)), pool) + 1.0],
             lambda x: [F.avg_pool2d(x, 2) + 1.0]),
    ]


def size_cases() -> list[Case]:
    """Sizes that take several programs per kernel at the default blocks (other tests use one)."""
    F = torch.nn.functional
    return [
        Case("gelu_5000", lambda g, feed: [g.gelu(feed((5000,)))], lambda x: [F.gelu(x)], 1, family="composite"),
        Case("softmax_600_rows", lambda g, feed: [g.softmax(feed((600, 9)))], lambda x: [torch.softmax(x, -1)], 1,
             family="composite"),
        Case("sum_axis0_2000", lambda g, feed: [g.reduction_sum(feed((2000, 3), integral=True), 0)],
             lambda x: [x.sum(0)], 1, EXACT),
        Case("broadcast_3000", lambda g, feed: [feed((30, 1, 10)) * feed((10, 1)) - feed((10,))],
             lambda a, b, c: [a * b - c], 1),
    ]


def all_cases() -> list[Case]:
    return elementwise_cases() + reduction_cases() + composite_cases() + contraction_cases() + view_cases() + \
        opaque_cases() + size_cases()


def opdb_cases() -> list[Case]:
    """Every sample of the op database (tests/opdb) as a sample graph, once it is on the branch."""
    try:
        from opdb import OPS
    except ImportError:  # the op database is built on another branch
        return []
    return [from_opdb(r, dt, i, s) for r in OPS.values() if r.ref is not None
            for dt in r.dtypes for i, s in enumerate(r.samples_for(dt))]


def from_opdb(record, dtype: sm.DType, index: int, sample) -> Case:
    """One op database sample as a Case: its args become placeholders (or variables), its reference the
    record's own (records without one, the random ops, are checked by their own tests)."""
    from opdb.core import as_outputs, ref_args

    def build(g, feed):
        args = []
        for i, a in enumerate(sample.args):
            if record.inputs == "variable":
                args.append(g.variable(a, name=f"in{i}"))
                continue
            p = g.placeholder(tuple(a.shape), sm.as_dtype(a.dtype), name=f"in{i}")
            feed[p] = a.contiguous()
            args.append(p)
        return record.call(g, args, sample.kwargs)

    def reference(*args):
        return as_outputs(record.ref(*ref_args(record, args), **sample.kwargs))

    known = record.known_failure("reference", dtype, f"{sample.name}/static")
    return Case(f"opdb-{record.name}-{dtype}-{index}", build, None if record.inputs == "variable" else reference,
                known_failure=known.reason if known else "", family=record.family, float_args=record.float_only)
