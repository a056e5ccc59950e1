"""The op database: one `OpInfo` record per builder method and per gradient-only primitive.

`OPS` maps each name to its record; the record modules hold them family by
family (elementwise, reduction, movement, indexing, contraction, scan,
image, state, composites, optim, control). To add an op, add one record to its family's module: its name,
samples (the generators of samples.py cover most shapes), a reference written
with NumPy or PyTorch without StitchML, its dtypes, error inputs and its
NumPy/PyTorch equivalent, and for a primitive how the compiler fuzzer draws it (`fuzz`) and the
value ranges of its operands (`domains`, `nonzero`). test_ops.py then fails until the record exists,
and its test of docs/ops.md says how to regenerate the table; test_opdb_complete.py fails until
the fuzzer and the compiled sample graphs can use it, or coverage.py says why not.
"""
from __future__ import annotations

import torch

from . import collective, composites, contraction, control, elementwise, image, indexing, movement, optim, reduction, scan, state
from .core import ALL, FLOATS, INTS, NUMERIC, ErrorInput, KnownFailure, OpInfo, P, Sample, expected
from .harness import Built, build, feeds_for, modes

# The suite runs one test process per core (pytest -n 2 on two cores), on tiny tensors: torch's
# intra-op threads only add wake-up latency there (10 ms per bfloat16 convolution instead of 0.1 ms).
torch.set_num_threads(1)

_RECORDS = [*elementwise.RECORDS, *reduction.RECORDS, *movement.RECORDS, *indexing.RECORDS,
            *contraction.RECORDS, *scan.RECORDS, *image.RECORDS, *state.RECORDS, *composites.RECORDS,
            *optim.RECORDS, *collective.RECORDS, *control.RECORDS]

OPS: dict[str, OpInfo] = {}
for _r in _RECORDS:
    if _r.name in OPS:
        raise ValueError(f"op database: two records for {_r.name!r}")
    OPS[_r.name] = _r

__all__ = ["OPS", "OpInfo", "Sample", "ErrorInput", "KnownFailure", "P", "Built", "build", "feeds_for", "modes",
           "expected", "ALL", "FLOATS", "INTS", "NUMERIC"]
