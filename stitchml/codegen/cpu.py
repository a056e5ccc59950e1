"""The CPU templates: a stitched kernel as one C++ loop nest, compiled by the system compiler.

Why C++ through the system compiler (the way Inductor's CPU backend works)
rather than Triton's CPU backend or numba: Triton's CPU backend is not part of
a released Triton that works with ours; numba would add a large dependency
whose JIT takes seconds per kernel and whose loops we would express in Python
again. The registry's elementwise facts are already expressions in a C-like
syntax (`tl.exp({0})`, `tl.where(c, a, b)`, `{0} // {1}`); with a small
prelude that gives `tl::` and `libdevice::` the same functions in C++, the same
facts generate both GPU and CPU kernels, so there is still one home per op.

* **pointwise**: one loop over the N elements of the kernel's iteration space,
  split over threads (OpenMP) and vectorised by the compiler where the loads are
  contiguous; every value stays in registers from op to op, one pass over memory.
* **reduction**: the frame is rows (kept axes) x columns (reduced axes); threads
  take rows; each row's per-element values live in a scratch row the size of
  the columns (in the core's cache for the widths normalisations have), row
  values are scalars. One read of the inputs, one write of the outputs.

Values of half types compute in float32, as in the Triton templates. Integer
division by zero sets the kernel's flag (common.NO_FLAG) instead of trapping,
as the GPU kernels do. Sources are compiled once and cached on disk, keyed by
the source, the compiler's version and the flags (`STITCHML_CACHE_DIR`, default
``~/.cache/stitchml``), written by an atomic rename so that concurrent processes
share the cache safely.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass

import torch

from .. import dtypes
from ..dtypes import DType
from ..ir import Operation, Tensor
from ..registry import lookup
from .common import Layout, _merge, checks_divisor, compute_dtype, index_expr, triton_template

CTYPE = {"float16": "_Float16", "bfloat16": "uint16_t", "float32": "float", "float64": "double", "int8": "int8_t",
         "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "bool": "bool",
         "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t"}
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# Rows whose scratch values would not fit this many elements per thread run through the reference instead.
MAX_SCRATCH = 1 << 22

PRELUDE = r'''
// No headers: the compiler's builtins only, so that a kernel compiles in a fraction of the time <cmath> takes.
typedef __INT8_TYPE__ int8_t; typedef __UINT8_TYPE__ uint8_t; typedef __INT16_TYPE__ int16_t;
typedef __UINT16_TYPE__ uint16_t; typedef __INT32_TYPE__ int32_t; typedef __UINT32_TYPE__ uint32_t;
typedef __INT64_TYPE__ int64_t; typedef __UINT64_TYPE__ uint64_t;
#define INF_F __builtin_inff()
#define INF_D __builtin_inf()

static inline float bf16_load(uint16_t h) { return __builtin_bit_cast(float, (uint32_t)h << 16); }
static inline uint16_t bf16_store(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if (f != f) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline void flag(int32_t* err, int32_t code) {
    int32_t seen = __atomic_load_n(err, __ATOMIC_RELAXED);
    while (code < seen && !__atomic_compare_exchange_n(err, &seen, code, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}
#define MATH1(name, fn) \
    static inline float name(float x) { return __builtin_##fn##f(x); } \
    static inline double name(double x) { return __builtin_##fn(x); }
namespace tl {
template <class T> static inline T abs(T x) { return x < 0 ? -x : x; }
static inline float abs(float x) { return __builtin_fabsf(x); }
static inline double abs(double x) { return __builtin_fabs(x); }
template <class P, class A, class B> static inline auto where(P p, A a, B b) -> decltype(a + b) {
    return p ? (decltype(a + b))a : (decltype(a + b))b; }
// NaN in either wins: x when x is NaN, else y when the comparison fails (y NaN, or not greater); two
// compares and one select, which makes a row's max fold ~10 % faster than testing each side for NaN
template <class A, class B> static inline auto maximum(A a, B b, int = 0) -> decltype(a + b) {
    decltype(a + b) x = a, y = b; return (x > y || x != x) ? x : y; }
template <class A, class B> static inline auto minimum(A a, B b, int = 0) -> decltype(a + b) {
    decltype(a + b) x = a, y = b; return (x < y || x != x) ? x : y; }
MATH1(exp2, exp2) MATH1(log2, log2) MATH1(sqrt, sqrt) MATH1(sqrt_rn, sqrt) MATH1(sin, sin) MATH1(cos, cos)
MATH1(floor, floor) MATH1(ceil, ceil)
static inline double exp(double x) { return __builtin_exp(x); }
static inline double erf(double x) { return __builtin_erf(x); }
static inline double log(double x) { return __builtin_log(x); }
static inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / __builtin_sqrt(x); }
static inline double sigmoid(double x) { return 1.0 / (1.0 + __builtin_exp(-x)); }
// float32 exp, erf, tanh and log without library calls, so that loops over them vectorise (a library
// call per element costs more than the memory traffic). Cephes' and Eigen's polynomials: within 2 ulp of
// the float64 result over the whole range (tests/test_cpu_backend.py sweeps them), NaN in, NaN out.
static inline float ldexp2(float y, int n) {  // y * 2**n for n in [-254, 254], through two normal factors
    int a = n >> 1, b = n - a;
    return y * __builtin_bit_cast(float, (uint32_t)(a + 127) << 23) * __builtin_bit_cast(float, (uint32_t)(b + 127) << 23);
}
static inline float exp(float x) {
    float xc = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : x);
    xc = x != x ? 0.0f : xc;
    // n = round(x / ln 2) by the 1.5 * 2**23 trick: adds only, so the loop vectorises (floor and float-to-int
    // conversions may trap, which keeps GCC from vectorising them)
    float shifted = xc * 1.44269504088896341f + 12582912.0f;
    float fx = shifted - 12582912.0f;
    int n = __builtin_bit_cast(int, shifted) - 0x4B400000;
    float r = xc - fx * 0.693359375f;
    r = r - fx * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f; y = y * r + 8.3334519073e-3f; y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f; y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    float out = ldexp2(y, n);
    out = x > 88.72283935546875f ? INF_F : out;
    out = x < -103.97208f ? 0.0f : out;
    return x != x ? x : out;
}
static inline float sigmoid(float x) {  // exp(-|x|): no overflow, and tiny results stay accurate
    float e = tl::exp(x < 0 ? x : -x), r = 1.0f / (1.0f + e);
    return x < 0 ? e * r : r;
}
static inline float erf(float a) {
    float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f; p = p * x2 + -2.10102402082508e-06f; p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f; p = p * x2 + -2.95459980854025e-03f; p = p * x2 + -1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f; q = q * x2 + -1.68282697438203e-03f; q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    float out = x * p / q;
    out = (x < 1e-12f && x > -1e-12f) ? x * 1.12837916709551257f : out;  // x * p / q underflows early
    return a != a ? a : out;
}
static inline float log(float x) {
    uint32_t u = __builtin_bit_cast(uint32_t, x);
    int e = (int)((u >> 23) & 0xFF);
    bool sub = e == 0;  // a subnormal: scale it up by 2**23 first
    float scaled = x * 8388608.0f;  // both arms computed: a select of values, not a branch, vectorises
    float xs = sub ? scaled : x;
    u = __builtin_bit_cast(uint32_t, xs);
    e = (int)((u >> 23) & 0xFF) - 126 - (sub ? 23 : 0);
    float f = __builtin_bit_cast(float, (u & 0x807FFFFFu) | 0x3F000000u);  // mantissa in [0.5, 1)
    bool small = f < 0.707106781186547524f;
    e = small ? e - 1 : e;
    float twice = f + f - 1.0f, once = f - 1.0f;
    f = small ? twice : once;
    float z = f * f;
    float y = 7.0376836292e-2f;
    y = y * f + -1.1514610310e-1f; y = y * f + 1.1676998740e-1f; y = y * f + -1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f; y = y * f + -1.6668057665e-1f; y = y * f + 2.0000714765e-1f;
    y = y * f + -2.4999993993e-1f; y = y * f + 3.3333331174e-1f;
    y = y * f * z;
    float fe = __builtin_bit_cast(float, e + 0x4B400000) - 12582912.0f;  // (float)e by adds: a conversion may trap,
    // which kept GCC from vectorising the loop (|e| < 2**22: exact)
    y = y + fe * -2.12194440e-4f;
    y = y - 0.5f * z;
    float out = f + y + fe * 0.693359375f;
    out = x == 0.0f ? -INF_F : out;
    out = x < 0.0f ? __builtin_nanf("") : out;
    out = x == INF_F ? x : out;
    return x != x ? x : out;
}
}
namespace libdevice {
MATH1(tan, tan) MATH1(asin, asin) MATH1(acos, acos) MATH1(atan, atan) MATH1(sinh, sinh) MATH1(cosh, cosh)
MATH1(rint, nearbyint) MATH1(trunc, trunc)
static inline double tanh(double x) { return __builtin_tanh(x); }
static inline float tanh(float x) {
    float ax = x < 0 ? -x : x;
    float big = 1.0f - 2.0f / (tl::exp(2.0f * (ax > 20.0f ? 20.0f : ax)) + 1.0f);
    big = x < 0 ? -big : big;
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                    + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    return ax < 0.625f ? small : big;
}
template <class T> static inline int isinf(T x) { return (x == (T)INF_D || x == -(T)INF_D) ? 1 : 0; }
template <class A, class B> static inline auto pow(A a, B b) -> decltype(a + b) {
    return sizeof(decltype(a + b)) == 4 ? (decltype(a + b))__builtin_powf((float)a, (float)b)
                                         : (decltype(a + b))__builtin_pow((double)a, (double)b); }
template <class A, class B> static inline auto atan2(A a, B b) -> decltype(a + b) {
    return sizeof(decltype(a + b)) == 4 ? (decltype(a + b))__builtin_atan2f((float)a, (float)b)
                                         : (decltype(a + b))__builtin_atan2((double)a, (double)b); }
}
'''


class CompilerUnavailable(RuntimeError):
    """No working C++ compiler: CPU executables run their kernels through the reference implementation."""


@dataclass
class CppSource:
    """A generated CPU kernel: its C++ function (compiled after `PRELUDE`); it takes the inputs' and
    outputs' data pointers (and the flag, `checks` non-empty), then the thread count."""

    name: str
    source: str
    template: str
    checks: tuple = ()


# -- expressions ------------------------------------------------------------------------------------------
def ctype(dt: DType) -> str:
    return CTYPE[dt.name]


def literal(value: torch.Tensor, dt: DType) -> str:
    """A scalar constant as C++ in the compute type of `dt`."""
    v = value.flatten()[0].item()
    cd = compute_dtype(dt)
    if dt.is_bool:
        return "true" if v else "false"
    if cd.is_floating:
        t = ctype(cd)
        if v != v:
            return f"({t})__builtin_nan(\"\")"
        if v in (float("inf"), float("-inf")):
            return f"{'' if v > 0 else '-'}({t})INF_D"
        return f"({t}){float(v)!r}"
    suffix = "" if abs(int(v)) < 2**31 else "ULL" if not cd.is_signed else "LL"
    return f"(({ctype(cd)}){int(v)}{suffix})"


_TRITON_TO_CPP = [(re.compile(r"tl\.PropagateNan\.ALL"), "1"), (re.compile(r"\btl\."), "tl::"),
                  (re.compile(r"\blibdevice\."), "libdevice::"), (re.compile(r"//"), "/"),
                  (re.compile(r"\bTrue\b"), "true"), (re.compile(r"\bFalse\b"), "false")]


def cpp_template(op: Operation) -> str | None:
    """The registry's Triton expression of an elementwise op as C++ (the prelude gives tl:: and
    libdevice:: the same functions; Triton's integer // and % truncate, as C++'s do)."""
    template = triton_template(op)
    if template is None:
        return None
    for pattern, repl in _TRITON_TO_CPP:
        template = pattern.sub(repl, template)
    return template


def load(ptr: str, idx: str, dt: DType) -> str:
    element = f"{ptr}[{idx}]"
    if dt == dtypes.bfloat16:
        return f"bf16_load({element})"
    return f"({ctype(compute_dtype(dt))}){element}"


def store(value: str, dt: DType) -> str:
    if dt == dtypes.bfloat16:
        return f"bf16_store((float)({value}))"
    return f"({ctype(dt)})({value})"


def expression(op: Operation, args: list[str]) -> str:
    """C++ for one elementwise op over already computed operand names, in the compute type of its result."""
    out = op.outputs[0].dtype
    target = ctype(compute_dtype(out))
    if op.op == "cast":
        if out == dtypes.bfloat16:
            return f"bf16_load(bf16_store((float)({args[0]})))"
        if out == dtypes.float16:
            return f"(float)(_Float16)({args[0]})"
        if out.is_bool:
            return f"(bool)(({args[0]}) != 0)"
        return f"({target})({args[0]})"
    template = cpp_template(op)
    if template is None:
        raise NotImplementedError(f"{op.op} has no C++ expression for {op.inputs[0].dtype}")
    return f"({target})({template.format(*args)})"


def _c_index(text: str) -> str:
    return text.replace("//", "/")


class _Body:
    """Lines of one loop body: the values it computes, by tensor id."""

    def __init__(self, checks: list, first_check: int):
        self.lines: list[str] = []
        self.count = 0
        self.checks = checks
        self.first_check = first_check

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def elementwise(self, op: Operation, args: list[str], indent: str) -> str:
        if checks_divisor(op):
            if not any(o is op for o in self.checks):
                self.checks.append(op)
            code = self.first_check + next(k for k, o in enumerate(self.checks) if o is op)
            safe = self.fresh("d")
            self.lines.append(f"{indent}auto {safe} = {args[1]};")
            self.lines.append(f"{indent}if ({safe} == 0) {{ flag(err, {code}); {safe} = 1; }}")
            args = [args[0], safe, *args[2:]]
        var = self.fresh("v")
        self.lines.append(f"{indent}{ctype(compute_dtype(op.outputs[0].dtype))} {var} = {expression(op, args)};")
        return var


def _pointer_type(dt: DType) -> str:
    # bool buffers are read and written as bytes: GCC has no vector type for C++ bool, so a loop that loads
    # one does not vectorise (a ReLU mask's select ran at a third of the speed); (bool)byte is byte != 0
    return "uint8_t" if dt.is_bool else ctype(dt)


def _signature(name: str, placeholders: list[Tensor], outputs: list[Tensor], checks: bool) -> list[str]:
    params = [f"const {_pointer_type(t.dtype)}* __restrict__ in{i}"
              for i, t in enumerate(placeholders)]
    params += [f"{_pointer_type(t.dtype)}* __restrict__ out{j}" for j, t in enumerate(outputs)]
    params += ["int32_t* err"] if checks else []
    return [f'extern "C" void {name}({", ".join(params + ["int threads"])}) {{']


# -- pointwise --------------------------------------------------------------------------------------------
def pointwise(name: str, body, in_layouts: list[Layout], first_check: int = 0) -> CppSource:
    """C++ for a pointwise fusion `body` reading inputs of the given layouts."""
    ops = [op for op in body.operations if op.op != "placeholder"]
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    n = body.outputs[0].type.numel()
    layout_of = {t.id: lay for t, lay in zip(placeholders, in_layouts)}
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    checks: list = []
    b = _Body(checks, first_check)
    value: dict = {}
    loaded: dict = {}
    indent = "        "

    shape = tuple(body.outputs[0].shape)
    one_frame = all(tuple(op.outputs[0].shape) == shape for op in ops if op.op != "constant")
    layouts = [layout_of[t.id] for t in placeholders]
    split = _row_split(shape, layouts, one_frame)
    # No split pays (columns under 16 long, a transposed read): one loop per axis instead of a flat loop
    # that divides its index per element for every axis of a strided input.
    nested = split is None and one_frame and bool(shape) and any(
        len(_merge(list(zip(lay.shape, lay.strides)))) > 1 for lay in (x.broadcast_to(shape) for x in layouts))

    def operand(t: Tensor, frame) -> str:
        if t.id in value:
            return value[t.id]
        key = (t.id, frame)
        if key not in loaded:
            lay = layout_of[t.id].broadcast_to(frame)
            if nested:
                idx = " + ".join(f"i{a} * {lay.strides[a]}LL" for a in range(len(frame)) if lay.strides[a]) or "0"
            elif split is None:
                idx = _c_index(index_expr("i", [(lay.shape[a], lay.strides[a]) for a in range(len(frame))]))
            else:
                idx = _c_index(" + ".join(p for p in (
                    index_expr("o", [(lay.shape[a], lay.strides[a]) for a in range(split)]),
                    index_expr("u", [(lay.shape[a], lay.strides[a]) for a in range(split, len(frame))])) if p != "0")
                    or "0")
            var = b.fresh("x")
            b.lines.append(f"{indent}{ctype(compute_dtype(t.dtype))} {var} = {load(arg_of[t.id], idx, t.dtype)};")
            loaded[key] = var
        return loaded[key]

    for op in ops:
        out = op.outputs[0]
        if op.op == "constant":
            value[out.id] = literal(op.attrs["value"], out.dtype)
            continue
        value[out.id] = b.elementwise(op, [operand(t, out.shape) for t in op.inputs], indent)
    for j, t in enumerate(body.outputs):
        v = value[t.id] if t.id in value else operand(t, t.shape)
        b.lines.append(f"{indent}out{j}[i] = {store(v, t.dtype)};")
    parallel = "omp parallel for simd schedule(static) num_threads(threads)" if n >= 1 << 15 else "omp simd"
    if nested:
        head = ["    #pragma omp parallel for schedule(static) num_threads(threads)"] if n >= 1 << 15 else []
        for a, extent in enumerate(shape):
            head += ["    #pragma omp simd"] if a == len(shape) - 1 else []
            head.append("    " + "  " * a + f"for (int64_t i{a} = 0; i{a} < {extent}LL; ++i{a}) {{")
        flat = "0"
        for a, extent in enumerate(shape):
            flat = f"i{a}" if a == 0 else f"({flat}) * {extent}LL + i{a}"
        loop = [*head, f"        const int64_t i = {flat};", *b.lines, "    " + "}" * len(shape)]
    elif split is None:
        loop = [f"    #pragma {parallel}", f"    for (int64_t i = 0; i < {n}LL; ++i) {{", *b.lines, "    }"]
    else:
        inner = 1
        for d in shape[split:]:
            inner *= d
        # small kernels open no parallel region at all (as the flat loop): even a one-thread region costs
        parallel = ["    #pragma omp parallel for schedule(static) num_threads(threads)"] if n >= 1 << 15 else []
        loop = [*parallel, f"    for (int64_t o = 0; o < {n // inner}LL; ++o) {{", "      #pragma omp simd",
                f"      for (int64_t u = 0; u < {inner}LL; ++u) {{", f"        const int64_t i = o * {inner}LL + u;",
                *b.lines, "      }", "    }"]
    lines = [*_signature(name, placeholders, list(body.outputs), bool(checks)), *loop, "}"]
    return CppSource(name, "\n".join(lines) + "\n", "pointwise", tuple(checks))


def _row_split(shape: tuple, layouts: list[Layout], one_frame: bool) -> int | None:
    """Where to split a pointwise kernel's flat loop into rows (outer axes) and columns (the axes from the
    split on), or None to keep one loop: an input read with broadcasting or strides that do not flatten (a
    bias added over channels) would otherwise divide the flat index per element, which costs more than
    the rest of the kernel (an int64 division does not vectorise). Rows take the division once each; the
    split is the first axis from which every input's columns flatten to one stride, if they are at least
    16 long. Needs every op of the kernel on the same frame."""
    if not one_frame or not shape:
        return None
    flat = [lay.broadcast_to(shape) for lay in layouts]
    if all(len(_merge(list(zip(lay.shape, lay.strides)))) <= 1 for lay in flat):
        return None  # one stride already: the flat loop has no division
    for k in range(1, len(shape)):
        if all(len(_merge([(lay.shape[a], lay.strides[a]) for a in range(k, len(shape))])) <= 1 for lay in flat):
            inner = 1
            for d in shape[k:]:
                inner *= d
            return k if inner >= 16 else None
    return None


# -- reduction --------------------------------------------------------------------------------------------
_COMBINE = {"reduction_sum": "{a} + {b}", "reduction_mean": "{a} + {b}", "reduction_product": "{a} * {b}",
            "reduction_maximum": "tl::maximum({a}, {b})", "reduction_minimum": "tl::minimum({a}, {b})"}


def _fold_lanes(combine: str, acc: str, first: int, count: int) -> str:
    """The partial results acc[first], ..., acc[first + count - 1] combined as a balanced tree: four steps of
    latency for sixteen lanes instead of fifteen in a chain, which a row of a few dozen columns (a softmax
    over a short sequence) would otherwise spend most of its time waiting on."""
    if count == 1:
        return f"{acc}[{first}]"
    half = count // 2
    return combine.format(a=f"({_fold_lanes(combine, acc, first, half)})",
                          b=f"({_fold_lanes(combine, acc, first + half, count - half)})")


def _neutral(op: Operation, acc: DType) -> str:
    text = lookup(op.op).combine.neutral
    t = ctype(acc)
    if text in ("INF", "-INF"):
        if acc.is_bool:
            return "false" if text == "-INF" else "true"
        if acc.is_floating:
            return f"{'-' if text == '-INF' else ''}({t})INF_D"
        info = torch.iinfo(acc.torch)
        value = info.min if text == "-INF" else info.max
        return f"(({t}){value}LL)" if value != -2**63 else f"(({t})(-9223372036854775807LL - 1))"
    return f"({t}){text}"


def _accumulator(op: Operation) -> DType:
    return compute_dtype(op.outputs[0].dtype)


def fits(body) -> bool:
    """Whether a reduction body's scratch rows fit (MAX_SCRATCH elements per thread)."""
    frame, axes, space = body.notes["frame"], body.notes["axes"], body.notes["space"]
    columns = 1
    for a in axes:
        columns *= frame[a]
    full = sum(1 for op in body.operations if space.get(op.outputs[0].id, "full") == "full") if body.operations else 0
    return columns * max(full, 1) <= MAX_SCRATCH


def reduction(name: str, body, in_layouts: list[Layout], first_check: int = 0) -> CppSource:
    """C++ for a reduction fusion `body` (notes: frame, axes, space): threads take rows; a row's
    per-element values live in scratch rows, its reductions and per-row values in scalars."""
    frame, axes, space = body.notes["frame"], body.notes["axes"], body.notes["space"]
    kept = [a for a in range(len(frame)) if a not in axes]
    rows = 1
    for a in kept:
        rows *= frame[a]
    cols = 1
    for a in axes:
        cols *= frame[a]
    keep_shape = tuple(1 if i in axes else d for i, d in enumerate(frame))
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    ops = [op for op in body.operations if op.op != "placeholder"]
    layout_of = {t.id: lay for t, lay in zip(placeholders, in_layouts)}
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    checks: list = []
    b = _Body(checks, first_check)
    env: dict = {}  # tensor id -> (name, full)
    scratch: list[str] = []
    row_in, col_in = "        ", "            "

    # Columns over reduced axes that are not adjacent (a channel's sum over batch and pixels) run as two loops,
    # outer axes (co) around the trailing run of adjacent ones (ci, c = co * inner + ci): the inner index is
    # then a multiple of ci, with no division per element, so the loop vectorises.
    ordered = sorted(axes)
    split = len(ordered)
    while split > 1 and ordered[split - 2] == ordered[split - 1] - 1:
        split -= 1
    outer_axes, inner_axes = ordered[:split - 1] if split > 1 else [], ordered[split - 1:] if split > 1 else ordered
    if not outer_axes or list(axes) != ordered:
        outer_axes, inner_axes = [], list(axes)
    inner = 1
    for a in inner_axes:
        inner *= frame[a]
    n_outer = cols // inner if inner else 1
    cvar = "ci" if outer_axes else "c"

    def column_index(strides) -> str:
        ci = index_expr(cvar, [(frame[a], strides[a]) for a in inner_axes])
        co = index_expr("co", [(frame[a], strides[a]) for a in outer_axes]) if outer_axes else "0"
        return " + ".join(p for p in (co, ci) if p != "0") or "0"

    def full_index(lay: Layout) -> str:
        lay = lay.broadcast_to(frame)
        r = index_expr("r", [(lay.shape[a], lay.strides[a]) for a in kept])
        return _c_index(" + ".join(p for p in (r, column_index(lay.strides)) if p != "0") or "0")

    def row_index(lay: Layout) -> str:
        if len(lay.shape) == len(kept) and lay.shape == tuple(frame[a] for a in kept):
            full = [0] * len(frame)
            for a, s in zip(kept, lay.strides):
                full[a] = s
            lay = Layout(keep_shape, tuple(full), lay.offset)
        lay = lay.broadcast_to(keep_shape)
        return _c_index(index_expr("r", [(lay.shape[a], lay.strides[a]) for a in kept]))

    # Segments, in op order: column loops (per-element ops and the reductions folded in them) and row ops.
    # A loop closes where an op needs a reduction of that loop (available after it).
    segments: list = []
    current: list = []
    reduced_here: set[int] = set()
    for op in ops:
        if op.op == "constant":
            continue
        full = space.get(op.outputs[0].id, "full") == "full"
        is_reduction = lookup(op.op).combine is not None
        if any(t.id in reduced_here for t in op.inputs):
            segments.append(("loop", current))
            current, reduced_here = [], set()
        if full or is_reduction:
            current.append(op)
            if is_reduction:
                reduced_here.add(op.outputs[0].id)
        else:
            segments.append(("row", op))
    if current:
        segments.append(("loop", current))
    made_in: dict[int, int] = {}
    for i, (kind, item) in enumerate(segments):
        for op in (item if kind == "loop" else [item]):
            made_in[op.outputs[0].id] = i
    needs_scratch: set[int] = set()
    for i, (kind, item) in enumerate(segments):
        for op in (item if kind == "loop" else [item]):
            for t in op.inputs:
                if made_in.get(t.id, i) != i and space.get(t.id, "full") == "full" and t.id in made_in:
                    needs_scratch.add(t.id)
    out_index = {t.id: j for j, t in enumerate(body.outputs)}
    contiguous = Layout.contiguous(frame)
    store_index = _c_index(" + ".join(p for p in (
        index_expr("r", [(frame[a], contiguous.strides[a]) for a in kept]), column_index(contiguous.strides))
        if p != "0") or "0")
    lanes = 16  # partial results per reduction, so that the compiler vectorises the fold

    def operand(t: Tensor, regs: dict, full: bool) -> str:
        if t.id in regs:
            return regs[t.id]
        if t.id in env:
            name, is_full = env[t.id]
            return f"{name}[c]" if is_full else name
        if t.op.op == "constant":
            return literal(t.op.attrs["value"], t.dtype)
        lay = layout_of[t.id]
        return load(arg_of[t.id], full_index(lay) if full else row_index(lay), t.dtype)

    def next_row(strides) -> str:  # column c0 of row rn
        parts = (index_expr("rn", [(frame[a], strides[a]) for a in kept]),
                 index_expr("c0", [(frame[a], strides[a]) for a in axes]))
        return _c_index(" + ".join(p for p in parts if p != "0") or "0")

    def next_row_prefetches() -> list[str]:
        # The first loop over a row reads it from memory; the later ones find it in L1 or L2 (4 KiB for
        # softmax's 1024 columns) and compute, so that the memory sits idle.
        # The second loop fetches the next row's inputs and output lines meanwhile, one line per 16
        # columns (softmax 4096 x 1024 on one thread: 4.5 -> 3.7 ms, the exp's compute over the next
        # row's loads). Addresses past the last row wrap (the index's modulo) or are never touched:
        # a prefetch does not fault.
        lines = []
        for t in placeholders:
            lay = layout_of[t.id].broadcast_to(frame)
            if any(lay.strides[a] for a in axes) and any(lay.strides[a] for a in kept):
                lines.append(f"{row_in}  __builtin_prefetch(&{arg_of[t.id]}[{next_row(lay.strides)}], 0, 3);")
        for j, t in enumerate(body.outputs):
            if space.get(t.id, "full") == "full":
                lines.append(f"{row_in}  __builtin_prefetch(&out{j}[{next_row(contiguous.strides)}], 1, 3);")
        return [f"{row_in}const int64_t rn = r + 1;", *lines] if lines else []

    loops_done = 0
    for kind, item in segments:
        if kind == "row":
            op = item
            env[op.outputs[0].id] = (b.elementwise(op, [operand(t, {}, False) for t in op.inputs], row_in), False)
            continue
        body_lines: list[str] = []
        outer, b.lines = b.lines, body_lines
        regs: dict = {}
        folds = []
        per_row: list[str] = []  # computed once a row, before the loop
        for op in item:
            out = op.outputs[0]
            if lookup(op.op).combine is not None:
                acc_type = _accumulator(op)
                acc = b.fresh("acc")
                x = f"({ctype(acc_type)})({operand(op.inputs[0], regs, True)})"
                body_lines.append(f"{col_in}{acc}[l] = {_COMBINE[op.op].format(a=f'{acc}[l]', b=x)};")
                folds.append((op, acc, acc_type))
                continue
            divisor = op.inputs[1] if op.op == "division" else None
            if (divisor is not None and divisor.id in env and not env[divisor.id][1]
                    and ctype(compute_dtype(out.dtype)) == ctype(compute_dtype(divisor.dtype)) == "float"):
                # a division by a row's value (softmax's sum, a norm's deviation) multiplies by its reciprocal,
                # taken once a row, as PyTorch's softmax does (≤ 1.5 ulp against 0.5; the division's
                # latency was ~12 % of softmax), where neither the divisor nor its reciprocal is subnormal
                # or infinite; other rows divide (the loop is unswitched on that test)
                d = env[divisor.id][0]
                rcp, ok = b.fresh("rcp"), b.fresh("ok")
                per_row += [f"{row_in}const float {rcp} = 1.0f / {d};",
                            f"{row_in}const bool {ok} = __builtin_fabsf({d}) >= 1.17549435e-38f && "
                            f"__builtin_fabsf({d}) <= 8.50705917e37f;"]
                v = b.fresh("v")
                x = operand(op.inputs[0], regs, True)
                body_lines.append(f"{col_in}float {v} = {ok} ? ({x}) * {rcp} : ({x}) / {d};")
            else:
                v = b.elementwise(op, [operand(t, regs, True) for t in op.inputs], col_in)
            regs[out.id] = v
            if out.id in needs_scratch:
                row = b.fresh("s")
                scratch.append(f"{ctype(compute_dtype(out.dtype))}* {row} = ({ctype(compute_dtype(out.dtype))}*)"
                               f"(base + {len(scratch)} * {cols}LL * 8);")
                body_lines.append(f"{col_in}{row}[c] = {v};")
                env[out.id] = (row, True)
        for t in body.outputs:  # per-element outputs made in this loop (or read from an input)
            if space.get(t.id, "full") == "full" and (t.id in regs or (t.id not in made_in and t is item[-1].outputs[0])):
                body_lines.append(f"{col_in}out{out_index[t.id]}[{store_index}] = {store(operand(t, regs, True), t.dtype)};")
        b.lines = outer
        b.lines.extend(per_row)
        for op, acc, acc_type in folds:
            b.lines.append(f"{row_in}{ctype(acc_type)} {acc}[{lanes}];")
            b.lines.append(f"{row_in}for (int l = 0; l < {lanes}; ++l) {acc}[l] = {_neutral(op, acc_type)};")
        main = inner - inner % lanes
        column = [f"{row_in}    const int64_t c = co * {inner}LL + ci;"] if outer_axes else []
        if outer_axes:
            b.lines.append(f"{row_in}for (int64_t co = 0; co < {n_outer}LL; ++co) {{")
        prefetch = next_row_prefetches() if loops_done == 1 and not outer_axes and rows > 1 else []
        loops_done += 1
        if main:
            b.lines.extend(prefetch[:1])
            b.lines.append(f"{row_in}for (int64_t c0 = 0; c0 < {main}LL; c0 += {lanes}) {{")
            b.lines.extend(prefetch[1:])
            b.lines.append(f"{row_in}  #pragma omp simd")  # lanes are independent: one vector per lane group
            b.lines.append(f"{row_in}  for (int l = 0; l < {lanes}; ++l) {{")
            b.lines.append(f"{row_in}    const int64_t {cvar} = c0 + l;")
            b.lines.extend(column + body_lines)
            b.lines.append(f"{row_in}  }}")
            b.lines.append(f"{row_in}}}")
        if inner % lanes:
            b.lines.append(f"{row_in}for (int64_t {cvar} = {main}LL; {cvar} < {inner}LL; ++{cvar}) {{")
            b.lines.append(f"{row_in}    const int l = 0;")
            b.lines.extend(column + body_lines)
            b.lines.append(f"{row_in}}}")
        if outer_axes:
            b.lines.append(f"{row_in}}}")
        for op, acc, acc_type in folds:
            total = _fold_lanes(_COMBINE[op.op], acc, 0, lanes)
            folded = b.fresh("red")
            b.lines.append(f"{row_in}{ctype(acc_type)} {folded} = {total};")
            if lookup(op.op).combine.mean:
                b.lines.append(f"{row_in}{folded} = {folded} / ({ctype(acc_type)}){cols};")
            env[op.outputs[0].id] = (folded, False)
    for j, t in enumerate(body.outputs):
        if space.get(t.id, "full") == "full":
            if t.id in made_in:
                continue  # stored in the loop that made it
            b.lines.append(f"{row_in}for (int64_t co = 0; co < {n_outer}LL; ++co) for (int64_t {cvar} = 0; "
                           f"{cvar} < {inner}LL; ++{cvar}) {{ const int64_t c = co * {inner}LL + {cvar}; "
                           f"out{j}[{store_index}] = {store(operand(t, {}, True), t.dtype)}; }}"
                           if outer_axes else f"{row_in}for (int64_t c = 0; c < {cols}LL; ++c) "
                           f"out{j}[{store_index}] = {store(operand(t, {}, True), t.dtype)};")
        else:
            b.lines.append(f"{row_in}out{j}[r] = {store(operand(t, {}, False), t.dtype)};")
    threads = "num_threads(threads)" if rows > 1 and rows * cols >= 1 << 15 else "num_threads(1)"
    lines = [*_signature(name, placeholders, list(body.outputs), bool(checks)),
             *([f"    #pragma omp parallel {threads}"] if threads != "num_threads(1)" else []), "    {",
             # scratch rows only where a value crosses loops: an unused allocation of a wide row is an
             # mmap and munmap per call
             *([f"        char* base = (char*)__builtin_malloc({len(scratch)} * {cols}LL * 8 + 64);"] if scratch else []),
             *("        " + s for s in scratch),
             "        #pragma omp for schedule(static)", f"    for (int64_t r = 0; r < {rows}LL; ++r) {{",
             *b.lines, "    }", *(["        __builtin_free(base);"] if scratch else []), "    }", "}"]
    return CppSource(name, "\n".join(lines) + "\n", "reduction", tuple(checks))


# -- compiling and loading --------------------------------------------------------------------------------
def find_compiler(candidates) -> tuple[str, str] | None:
    """(path, version line) of the first of `candidates` (names or paths; None is skipped) on PATH that
    answers `--version`; None if none does."""
    for candidate in candidates:
        path = candidate and shutil.which(candidate)
        if path:
            try:
                version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                                         check=True).stdout.splitlines()[0]
            except (OSError, subprocess.SubprocessError, IndexError):
                continue
            return path, version
    return None


@functools.cache
def compiler() -> tuple[str, str]:
    """(path, version line) of the C++ compiler: $CXX, else g++, else clang++; CompilerUnavailable if none."""
    found = find_compiler((os.environ.get("CXX"), "g++", "clang++", "c++"))
    if found is None:
        raise CompilerUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")
    return found


@functools.cache
def _cpu_features() -> str:
    """The CPU's instruction-set flags: -march=native code is for this CPU, so a cache shared between
    machines keys on them."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        import platform

        return platform.processor() or platform.machine()


def cache_dir() -> str:
    root = os.environ.get("STITCHML_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "stitchml")
    path = os.path.join(root, "cpu")
    os.makedirs(path, exist_ok=True)
    return path


_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def _library(sources: list[CppSource]) -> ctypes.CDLL:
    """The shared library of `sources` (one translation unit), from the disk cache or compiled now."""
    path, version = compiler()
    text = "".join(src.source for src in sources)
    # the prelude is part of every kernel: a change to its functions must not find the old libraries
    key = hashlib.sha256("\0".join([PRELUDE, text, version, *FLAGS, _cpu_features()]).encode()).hexdigest()[:32]
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            so = os.path.join(cache_dir(), f"{sources[0].name}-{key}.so")
            if not os.path.exists(so):
                _compile(path, PRELUDE + "".join(src.source for src in sources), so, sources[0].name)
            lib = _loaded[key] = ctypes.CDLL(so)
    return lib


def _compile(path: str, text: str, so: str, name: str) -> None:
    folder = os.path.dirname(so)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cpp = os.path.join(tmp, "kernels.cpp")
        with open(cpp, "w") as f:
            f.write(text)
        out = os.path.join(tmp, "kernels.so")
        result = subprocess.run([path, *FLAGS, cpp, "-o", out], capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise CompilerUnavailable(f"{os.path.basename(path)} failed on kernel {name}: "
                                      f"{result.stderr.strip()[-2000:]}")
        os.replace(out, so)  # atomic: another process sees no file or a whole one


class Module:
    """The CPU kernels of one executable, compiled together: one compiler run, the prelude parsed once.

    If the whole module fails to compile, each kernel is compiled alone, and one that still fails
    runs through its fallback (the reference implementation), with the reason logged."""

    def __init__(self) -> None:
        self.sources: list[CppSource] = []
        self.functions: dict[str, object] = {}
        self.errors: dict[str, str] = {}

    def add(self, src: CppSource) -> None:
        self.sources.append(src)

    def build(self) -> None:
        if not self.sources or self.functions or self.errors:
            return
        try:
            groups = [(self.sources, _library(self.sources))]
        except CompilerUnavailable:
            groups = []
            for src in self.sources:
                try:
                    groups.append(([src], _library([src])))
                except CompilerUnavailable as e:
                    self.errors[src.name] = str(e)
        for sources, lib in groups:
            for src in sources:
                fn = getattr(lib, src.name)
                fn.restype = None
                self.functions[src.name] = fn


class NativeLaunch:
    """Run a compiled CPU kernel of `module` on its pre-bound slots (data pointers, then the thread
    count); `fallback(env)` when it did not compile. The function's argument types are declared once, so
    a call converts plain ints (no ctypes objects made per call)."""

    def __init__(self, module: Module, src: CppSource, ins: list[int], outs: list[int], fallback):
        self.module, self.name, self.fallback = module, src.name, fallback
        self.slots = ins + outs
        self.fn = None

    def __call__(self, env) -> None:
        fn = self.fn
        if fn is None:
            self.module.build()
            fn = self.fn = self.module.functions.get(self.name, self.fallback)
            if fn is not self.fallback:
                fn.argtypes = [ctypes.c_void_p] * len(self.slots) + [ctypes.c_int]
        if fn is self.fallback:
            self.fallback(env)
            return
        fn(*[env[s].data_ptr() for s in self.slots], torch.get_num_threads())
