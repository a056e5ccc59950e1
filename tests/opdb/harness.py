"""Building and running a record's sample as a graph, in each placeholder variant.

Variants: "static" (placeholders of the exact shapes), "dynamic" (every
extent -1, or the sample's own partial shapes, and the sample's further feeds
of other sizes) and "unranked" (shape None). Records whose inputs are
variables build them with `graph.variable` instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

import stitchml as sm

from .core import OpInfo, Sample


@dataclass
class Built:
    """A graph holding one call of a record's op."""

    graph: sm.Graph
    inputs: list[sm.Tensor]
    outputs: list[sm.Tensor]
    mode: str

    def run(self, args: Sequence[torch.Tensor], targets: Sequence[sm.Tensor] | None = None) -> list[torch.Tensor]:
        """Feed `args` (or set them as the variables' values) and return the targets' values."""
        feeds = {}
        for t, a in zip(self.inputs, args):
            if t.op.op == "variable":
                self.graph.set_variable_value(t, a)
            else:
                feeds[t] = sm.TensorData(a)
        targets = list(self.outputs if targets is None else targets)
        results = self.graph.run(feeds, targets, device="cpu")
        return [results[t].torch() for t in targets]


def modes(record: OpInfo, sample: Sample) -> list[str]:
    """The variants a sample is built in (placeholders of unknown extents need tensor args)."""
    if record.inputs == "variable" or not sample.args:
        return ["static"]
    out = ["static"]
    if record.dynamic and sample.dynamic is not False:
        out.append("dynamic")
    if record.unranked and sample.unranked:
        out.append("unranked")
    return out


def feeds_for(sample: Sample, mode: str) -> list[tuple]:
    """The arg tuples fed in turn to one graph: the sample, then (with -1 extents) its other sizes."""
    return [sample.args] + (list(sample.more) if mode != "static" else [])


def build(record: OpInfo, sample: Sample, mode: str = "static") -> Built:
    g = sm.Graph(record.name)
    tensors = []
    for i, a in enumerate(sample.args):
        if record.inputs == "variable":
            tensors.append(g.variable(a, name=f"in{i}"))
            continue
        if mode == "static":
            shape = tuple(a.shape)
        elif mode == "unranked":
            shape = None
        else:
            shape = sample.dynamic[i] if sample.dynamic else (-1,) * a.dim()
        tensors.append(g.placeholder(shape, sm.as_dtype(a.dtype), name=f"in{i}"))
    return Built(g, tensors, record.call(g, tensors, sample.kwargs), mode)
