"""docs/ops.md, rendered from the registry and the op database.

The registry gives each op its kind and what it does; the database record
gives its NumPy/PyTorch equivalent, its dtypes and whether it is
differentiable. test_ops.py checks that the file is up to date; to rewrite it:
``STITCHML_REGENERATE=1 python -m pytest tests/test_ops.py -k ops_md``.
"""
from __future__ import annotations

import inspect

import stitchml as sm
from stitchml.registry import BUILDERS, COMPOSITES, KINDS, REGISTRY

from .core import ALL, FLOATS, INTS, NUMERIC, OpInfo

_DTYPE_SETS = [(set(ALL), "all"), (set(NUMERIC), "numeric"), (set(FLOATS), "floating"), (set(INTS), "integer"),
               (set(NUMERIC) | {sm.bool}, "all")]

_HEADER = """# Operations

Every builder method of `Graph`, one row each, generated from the op registry
(`stitchml/registry.py`, `stitchml/ops/`), the composites
(`stitchml/composites.py`) and the op database the tests run on
(`tests/opdb`). Do not edit by hand: run
`STITCHML_REGENERATE=1 python -m pytest tests/test_ops.py -k ops_md`.

* **kind**: what the compiler may do with the op (elementwise, reduction,
  movement, contraction, opaque, random, state); *composite* ops are Python
  functions of primitives; *builder* ops emit other primitives.
* **dtypes**: the input types the tests cover. Integer and bool inputs of
  float-only ops are promoted to float32 (docs/semantics.md). Every op that
  takes uint8 takes uint16, uint32 and uint64 too, eager and compiled
  (tests/test_dtypes_unsigned.py).
* **gradient**: *yes* when `graph.gradients` flows through the op, *no* when
  the op stops it on purpose (`differentiable=False`).
"""


def _what(name: str) -> str:
    prim = REGISTRY.get(name)
    text = prim.doc if prim is not None and prim.doc else inspect.getdoc(BUILDERS.get(name)) or ""
    first = text.strip().split("\n\n")[0]
    return " ".join(first.split()).replace("|", "\\|")


def _dtypes(record: OpInfo) -> str:
    have = set(record.dtypes)
    for group, label in _DTYPE_SETS:
        if have == group:
            return label
    return ", ".join(str(d) for d in record.dtypes)


def _kind(name: str) -> str:
    if name in COMPOSITES:
        return "composite"
    return REGISTRY[name].kind if name in REGISTRY else "builder"


def _row(record: OpInfo) -> str:
    name = f"`{record.name}`" + ("" if record.builder else " (emitted by gradients)")
    cells = [name, _kind(record.name), _what(record.name), record.equivalent.replace("|", "\\|"), _dtypes(record),
             "yes" if record.differentiable else "no"]
    return "| " + " | ".join(cells) + " |"


def render(ops: dict[str, OpInfo]) -> str:
    """The whole of docs/ops.md: one table per kind, rows in name order."""
    order = list(KINDS) + ["builder", "composite"]
    parts = [_HEADER]
    for kind in order:
        rows = [_row(r) for name, r in sorted(ops.items()) if _kind(name) == kind]
        if not rows:
            continue
        parts.append(f"\n## {kind.capitalize()}\n\n| op | kind | what it does | NumPy / PyTorch | dtypes | gradient |\n"
                     "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    return "".join(parts)
