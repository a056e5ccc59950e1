"""A readable summary of a package: functions, signatures, op counts, weight sizes, kernels.

    $ stitchml package inspect model.smpkg
"""
from __future__ import annotations


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary(package) -> str:
    """The text `stitchml package inspect` prints."""
    p = package.producer
    lines = [f"producer: {p.get('name', '?')} {p.get('version', '')}".rstrip()
             + (f" ({p['source']})" if p.get("source") else "")]
    for name, fn in package.functions.items():
        consts = [op.attrs["value"] for op in fn.graph.operations if op.op == "constant"]
        lines.append(f"function {name}")
        lines.append("  inputs:  " + ", ".join(str(port) for port in fn.inputs))
        lines.append("  outputs: " + ", ".join(str(port) for port in fn.outputs))
        lines.append(f"  weights: {len(consts)} tensors, {sum(c.numel() for c in consts)} elements, "
                     f"{_bytes(fn.weight_bytes())}")
        counts = fn.op_counts()
        lines.append(f"  ops:     {sum(counts.values())} in all")
        for op, n in counts.items():
            lines.append(f"    {op:<28} {n}")
    if package.kernels:
        lines.append("compiled kernels")
        for k in package.kernels:
            dims = ", ".join(f"{n}={list(d)}" for n, d in k.input_dimensions.items())
            lines.append(f"  {k.function} [{dims}] for {k.target.get('arch')} / triton {k.target.get('triton')}")
    else:
        lines.append("compiled kernels: none (compiled when a pipeline is made)")
    return "\n".join(lines)
