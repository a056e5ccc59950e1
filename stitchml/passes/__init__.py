"""The compiler: a pipeline of passes, each `pass(program, ctx) -> program`.

    verify        the IR is well formed and every type follows its op's rule
    simplify      shape-only ops become static; algebraic identities (x*1, x+0, cast to self...)
    fold          ops of constants are evaluated (small results only)
    cse           identical pure ops computed once
    prune         ops no output or assignment needs are dropped
    attention     softmax(Q Kᵀ · scale [+ mask]) V from primitives becomes one fused kernel
    recurrent     an LSTM cell, and the arg maximum of a product's epilogue, become one kernel each
    stitch        adjacent ops grouped into kernels (legality, score, policy kept apart)
    prologue      elementwise producers of a matrix product's operands move into its kernel's loads
    plan_memory   every intermediate gets an offset in one arena, by liveness
    lower         each kernel becomes a pre-bound launch: the LaunchPlan an Executable runs

Set STITCHML_DUMP_IR=1 to print the program after every pass, or to a
directory to write one file per pass there.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .program import CompileError, Program, extract
from .verify import verify
from .simplify import simplify
from .fold import fold
from .cse import cse
from .prune import prune
from .attention import attention
from .recurrent import recurrent
from .stitch import stitch
from .prologue import prologue
from .memory import plan_memory
from .lower import lower


@dataclass
class CompileContext:
    """What the passes share: the target, options, and what each pass reports."""

    device: torch.device
    backend: str  # "triton" (CUDA), "interpret" (TRITON_INTERPRET on the CPU), "native" (C++, CPU) or "reference"
    options: dict[str, Any] = field(default_factory=dict)
    run_context: Callable[[], Any] | None = None  # a run's RunContext (its run index), for random ops
    fusion_report: list = field(default_factory=list)  # stitch: kernels and refusals
    attention_report: list = field(default_factory=list)  # attention: where it applied, or why not
    recurrent_report: list = field(default_factory=list)  # recurrent: where it applied, or why not
    boundaries: list = field(default_factory=list)  # stitch: a reason for every edge between steps
    memory_plan: Any = None  # plan_memory
    launch_plan: Any = None  # lower: a runtime.launch.LaunchPlan
    timings: dict[str, float] = field(default_factory=dict)

    def compile_block(self, program: Program) -> tuple[Program, "CompileContext"]:
        """`program` (a control-flow block's) through the whole pipeline for this target, in a context of
        its own; its fusion report joins this one's (passes/control.py: a passes module cannot import
        the pipeline that imports it)."""
        sub = CompileContext(device=self.device, backend=self.backend, options=dict(self.options))
        program = run_pipeline(program, sub)
        self.fusion_report.extend(sub.fusion_report)
        return program, sub


PIPELINE: list[tuple[str, Callable[[Program, CompileContext], Program]]] = [
    ("verify", verify),
    ("simplify", simplify),
    ("fold", fold),
    ("cse", cse),
    ("prune", prune),
    ("attention", attention),
    ("recurrent", recurrent),
    ("stitch", stitch),
    ("prologue", prologue),
    ("plan_memory", plan_memory),
    ("lower", lower),
]


def _dump(name: str, index: int, program: Program) -> None:
    target = os.environ.get("STITCHML_DUMP_IR")
    if not target:
        return
    text = f"// after {name}\n{program}\n"
    if target in ("1", "stdout"):
        print(text)
    else:
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, f"{index:02d}_{name}.txt"), "w") as f:
            f.write(text)


def run_pipeline(program: Program, ctx: CompileContext) -> Program:
    _dump("extract", 0, program)
    for i, (name, fn) in enumerate(PIPELINE, 1):
        start = time.perf_counter()
        program = fn(program, ctx)
        ctx.timings[name] = time.perf_counter() - start
        _dump(name, i, program)
    return program


__all__ = ["CompileContext", "CompileError", "PIPELINE", "Program", "extract", "run_pipeline"]
