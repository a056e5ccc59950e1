"""Run the ONNX backend node tests through the ONNX importer and the eager executor.

Public: a user checks what the installed onnx version's operators give here;
the report is docs/onnx_conformance.md and tests/test_onnx_conformance.py runs
the in-scope cases (`cases_for`, `check`).

The node tests are written by the ONNX project: one model of one operator,
inputs, and the outputs its authors computed. They are read from
``onnx/backend/test/data/node`` when the installed onnx package ships that
folder, and otherwise generated from the test-case definitions it does ship
(``onnx.backend.test.case.node``), which hold the same models and data.
Outputs are compared as ONNX's own backend runner does: same dtype, then
``assert_allclose(rtol=1e-3, atol=1e-7)``.

    $ stitchml conformance onnx             # prints the rates, writes docs/onnx_conformance.md
    $ stitchml conformance onnx --op Conv   # one operator, each test's result printed
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

# Why the failing groups above stay failing (the report lists each test below).
OUT_OF_SCOPE = [
    "- Element types int4, uint4, int2, uint2, float4_e2m1 and float8_e8m0: PyTorch has no tensor type for "
    "them that computes or converts (its int4/uint4 are placeholders), so they have no StitchML dtype; "
    "strings likewise.",
    "- Sequences and optionals (SequenceMap, Optional*, sequence-typed If/Loop): graph values are tensors.",
    "- Training-mode Dropout and BatchNormalization: packages run inference.",
    "- Operators outside the importer's table (docs/packages.md lists the table) and opsets older than "
    "the importer reads (convert with onnx.version_converter).",
]


@dataclass
class Case:
    name: str
    op: str
    model: Any  # onnx.ModelProto
    data_sets: list  # [(inputs, outputs)], NumPy arrays (or other ONNX values, which we do not support)
    rtol: float = 1e-3
    atol: float = 1e-7

    @property
    def types_supported(self) -> bool:
        """Whether every graph input and output has an element type StitchML has."""
        from .onnx_values import _ONNX_DTYPES

        values = list(self.model.graph.input) + list(self.model.graph.output)
        return all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in _ONNX_DTYPES for v in values)

    @property
    def ops(self) -> set[str]:
        """Every operator the test's model uses (an expanded test uses several)."""
        return {n.op_type for n in self.model.graph.node}

    @property
    def in_scope(self) -> bool:
        """Whether the importer has a handler for every operator of the model (the registry's ops)."""
        from .onnx_import import HANDLERS

        return self.ops <= set(HANDLERS)


def _op_of(model, name: str, ops_by_name: dict[str, str]) -> str:
    if "_expanded" in name:
        base = name.split("_expanded")[0]
        if base in ops_by_name:
            return ops_by_name[base]
    nodes = [n.op_type for n in model.graph.node if n.op_type != "Constant"] or [n.op_type for n in model.graph.node]
    return nodes[0] if nodes else "?"


def _attribute(cases: list[tuple[str, Any, list]]) -> list[Case]:
    single = {name: m.graph.node[0].op_type for name, m, _ in cases if len(m.graph.node) == 1}
    return [Case(name, _op_of(m, name, single), m, data) for name, m, data in sorted(cases, key=lambda c: c[0])]


def _from_folder(root: str) -> list[Case]:
    import onnx
    from onnx import numpy_helper

    cases = []
    for d in sorted(glob.glob(os.path.join(root, "test_*"))):
        model = onnx.load(os.path.join(d, "model.onnx"))
        data = []
        for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*"))):
            def read(kind):
                out = []
                for f in sorted(glob.glob(os.path.join(ds, f"{kind}_*.pb")), key=lambda p: int(p.split("_")[-1][:-3])):
                    t = onnx.TensorProto()
                    with open(f, "rb") as fh:
                        t.ParseFromString(fh.read())
                    out.append(numpy_helper.to_array(t))
                return out

            data.append((read("input"), read("output")))
        cases.append((os.path.basename(d), model, data))
    return _attribute(cases)


def _generated() -> list[Case]:
    import warnings

    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = node.collect_testcases()
    def arrays(values):
        return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in values]

    return _attribute([(c.name, c.model, [(arrays(i), arrays(o)) for i, o in c.data_sets]) for c in raw])


_CACHE: list[Case] | None = None


def node_cases() -> list[Case]:
    """Every ONNX backend node test (read from the shipped folder, else generated)."""
    global _CACHE
    if _CACHE is None:
        import onnx

        root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
        _CACHE = _from_folder(root) if os.path.isdir(root) else _generated()
    return _CACHE


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:220]


def check(case: Case) -> str | None:
    """None when the case passes, else why it failed (one line). Inputs are fed as the test gives them."""
    from ..errors import PackageError
    from .onnx_import import from_onnx

    try:
        fn = from_onnx(case.model).function()
    except PackageError as e:
        return f"import: {str(e)[:200]}"
    except Exception as e:  # an importer bug is a failure to report, not a crash of the run
        return f"import crashed: {_first_line(e)}"
    names = [p.name for p in fn.inputs]
    all_names = [v.name for v in case.model.graph.input]
    for inputs, expected in case.data_sets:
        inputs = [np.asarray(v) if isinstance(v, np.generic) else v for v in inputs]
        expected = [np.asarray(v) if isinstance(v, np.generic) else v for v in expected]
        inputs = [v for n, v in zip(all_names, inputs) if n in names]
        if not all(isinstance(v, np.ndarray) for v in list(inputs) + list(expected)):
            return "data: sequence, optional or map values are not tensors"
        if len(inputs) != len(names):
            return f"inputs: the model takes {len(names)} inputs, the data set has {len(inputs)}"
        try:
            with np.errstate(all="ignore"):
                got = fn(**dict(zip(names, inputs)))
        except Exception as e:
            return f"run: {_first_line(e)}"
        for port, want in zip(fn.outputs, expected):
            out = got[port.name].numpy()
            if out.dtype != want.dtype:
                return f"output {port.name}: dtype {out.dtype}, expected {want.dtype}"
            if out.shape != want.shape:
                return f"output {port.name}: shape {out.shape}, expected {want.shape}"
            try:
                np.testing.assert_allclose(out, want, rtol=case.rtol, atol=case.atol)
            except AssertionError:
                with np.errstate(all="ignore"):
                    err = np.nanmax(np.abs(out.astype(np.float64) - want.astype(np.float64))) if out.size else 0
                return f"output {port.name}: values differ (max abs error {err:.3g})"
    return None


def run(cases: list[Case]) -> dict[str, str | None]:
    return {c.name: check(c) for c in cases}


def cause(failure: str) -> str:
    """A failure's reason without the values of one case (names, numbers, shapes), to group by."""
    text = re.sub(r"^(import|run): node '[^']*' \(\w+\): ", r"\1: ", failure)
    text = re.sub(r"node '[^']*' \((\w+)\)", r"node (\1)", text)
    text = re.sub(r"; (inputs|built at).*$", "", text)
    text = re.sub(r"\([^()]*\bbuilt at [^()]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]|\([0-9, ]*\)|'[^']*'|\b\d+(\.\d+)?(e-?\d+)?\b", "…", text)
    return text[:140]


def report(cases: list[Case], results: dict[str, str | None], seconds: float) -> str:
    """The Markdown written to docs/onnx_conformance.md."""
    import onnx

    def rate(sel):
        n = len(sel)
        p = sum(results[c.name] is None for c in sel)
        return p, n, (100.0 * p / n if n else 0.0)

    scope = [c for c in cases if c.in_scope]
    p_all, n_all, r_all = rate(cases)
    p_in, n_in, r_in = rate(scope)
    p_typed, n_typed, r_typed = rate([c for c in scope if c.types_supported])
    lines = [
        "# ONNX backend node tests",
        "",
        "Generated by `stitchml conformance onnx`; do not edit by hand.",
        f"onnx {onnx.__version__}, {n_all} node tests, run in {seconds:.0f} s on the CPU through the ONNX "
        "importer and the eager executor. Each test's model is imported as it is and fed the test's inputs "
        "(TensorProtos read with `onnx.numpy_helper`); nothing is bound at import time. Outputs are compared as "
        "ONNX's backend runner compares (dtype, shape, then `assert_allclose(rtol=1e-3, atol=1e-7)`).",
        "",
        "| selection | passed | total | rate |",
        "| --- | --- | --- | --- |",
        f"| all node tests | {p_all} | {n_all} | {r_all:.1f}% |",
        f"| in scope: every operator of the test is in the importer's table | {p_in} | {n_in} | {r_in:.1f}% |",
        f"| in scope, on element types StitchML has (not 4-bit, 2-bit, float4, float8_e8m0, strings) | "
        f"{p_typed} | {n_typed} | {r_typed:.1f}% |",
        "",
        "## Failures by cause",
        "",
        "| cause | tests | operators |",
        "| --- | --- | --- |",
    ]
    groups: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        if results[c.name] is not None:
            groups[cause(results[c.name])].append(c)
    for text, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ops = sorted({c.op for c in members})
        shown = ", ".join(ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
        lines.append(f"| {text.replace('|', '/')} | {len(members)} | {shown} |")
    lines += ["", "## What stays out", "", *OUT_OF_SCOPE]
    lines += ["", "## Operators", "",
              "A test counts under the operator it tests (an `_expanded` test under the operator it expands).", "",
              "| operator | passed | total | in scope | passed in scope |", "| --- | --- | --- | --- | --- |"]
    by_op = defaultdict(list)
    for c in cases:
        by_op[c.op].append(c)
    for op in sorted(by_op):
        p, n, _ = rate(by_op[op])
        pi, ni, _ = rate([c for c in by_op[op] if c.in_scope])
        lines.append(f"| {op} | {p} | {n} | {ni} | {pi} |")
    lines += ["", "## Failures in scope", ""]
    for c in scope:
        if results[c.name] is not None:
            lines.append(f"- `{c.name}` ({c.op}): {results[c.name]}")
    return "\n".join(lines) + "\n"


def summary(cases: list[Case], results: dict[str, str | None]) -> str:
    """The lines the command prints: the rates, then the largest groups of failures."""
    p_all = sum(results[c.name] is None for c in cases)
    scope = [c for c in cases if c.in_scope]
    p_in = sum(results[c.name] is None for c in scope)
    typed = [c for c in scope if c.types_supported]
    p_typed = sum(results[c.name] is None for c in typed)
    out = [f"all node tests: {p_all}/{len(cases)} ({100 * p_all / max(len(cases), 1):.1f}%)",
           f"in scope:       {p_in}/{len(scope)} ({100 * p_in / max(len(scope), 1):.1f}%)",
           f"  on our types: {p_typed}/{len(typed)} ({100 * p_typed / max(len(typed), 1):.1f}%)", "",
           "failures by cause:"]
    groups = Counter(cause(r) for r in results.values() if r is not None)
    out += [f"  {n:4d}  {text}" for text, n in groups.most_common(15)]
    return "\n".join(out)


def cases_for(op: str | None = None, in_scope_only: bool = False) -> Iterator[Case]:
    for c in node_cases():
        if (op is None or c.op == op) and (not in_scope_only or c.in_scope):
            yield c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml conformance onnx", description=__doc__.splitlines()[0])
    parser.add_argument("--op", help="only this ONNX operator; prints each test's result")
    parser.add_argument("--out", default=os.path.join("docs", "onnx_conformance.md"),
                        help="where to write the report (default: docs/onnx_conformance.md; '-' writes none)")
    args = parser.parse_args(argv)
    start = time.time()
    cases = list(cases_for(args.op))
    if not cases:
        known = sorted({c.op for c in node_cases()})
        parser.error(f"--op {args.op!r}: no ONNX node test of that operator; the suite has {len(known)} operators, "
                     f"such as {', '.join(known[:8])}")
    results = run(cases)
    if args.op:
        for c in cases:
            print(f"{'PASS' if results[c.name] is None else 'FAIL'} {c.name}  {results[c.name] or ''}")
        print(summary(cases, results))
        return 0
    print(summary(cases, results))
    if args.out != "-":
        with open(args.out, "w") as f:
            f.write(report(cases, results, time.time() - start))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
