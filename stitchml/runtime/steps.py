"""steps: what an executable runs, and the errors a failing run raises.

A `Step` is one pre-bound unit of work over an environment list of value
slots; the compiler's last pass (passes/lower.py) produces them and the
executables (executable.py, bound.py) run them. The error helpers live here,
beside the runs that raise them, so the runtime does not depend on the passes:

* `built_at(op)`: how errors name an op, as an op-by-op run does;
* `failure(step, error, ...)`: the typed error a run raises when a step failed;
* `raise_flagged(env, checks, flag_slot)`: the integer division by zero that a
  kernel flagged in its one-element buffer (a kernel cannot raise).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..codegen.common import NO_FLAG
from ..errors import ExecutionError, StitchError
from ..ir import Operation, built_at


@dataclass
class Step:
    """One unit of work: `run(env)`; `name` and `kind` are for reports and traces."""

    name: str
    kind: str
    run: Callable[[list], None]
    source: str | None = None  # generated Triton source, if any
    writes: tuple[int, ...] = ()  # buffer ids it writes (poison checks look at their guard zones)
    ops: tuple[Operation, ...] = ()  # the user's ops it computes, for errors
    inputs: tuple[tuple[str, int], ...] = ()  # (tensor name, slot) of what it reads, for errors



def run_steps(steps: list[Step], env: list, checks: list[Operation], flag_slot: int | None,
              check_flag: bool = True) -> None:
    """Run `steps` over `env`; a failing step raises `failure`'s error, and (with `check_flag`) a zero
    integer divisor a kernel flagged is raised at the end."""
    step = None
    try:
        for step in steps:
            step.run(env)
    except Exception as e:
        raise failure(step, e, env, checks, flag_slot) from e
    if check_flag and flag_slot is not None:
        raise_flagged(env, checks, flag_slot)


def failure(step: Step, error: BaseException, env: list, checks: list[Operation], flag_slot: int | None):
    """The error a run raises when `step` raised `error`: our typed errors pass through; anything else
    becomes the ExecutionError an op-by-op run gives, naming every op the step computes. A zero divisor
    flagged by an earlier kernel is reported first (the failure may be its consequence)."""
    if flag_slot is not None:
        raise_flagged(env, checks, flag_slot)
    if isinstance(error, StitchError):
        return error
    shapes = ", ".join(f"{name}: {tuple(v.shape)} {v.dtype}" if isinstance(v := env[slot], torch.Tensor) else name
                       for name, slot in step.inputs)
    what = ", ".join(built_at(op) for op in step.ops) or step.name
    if len(step.ops) > 1:
        what += f" (fused in kernel {step.name})"
    return ExecutionError(f"{what} failed on inputs [{shapes}]: {error}")


def raise_flagged(env: list, checks: list[Operation], flag_slot: int) -> None:
    """Raise the ExecutionError of the first flagged op, if any: an integer division that met a zero divisor,
    or a gather whose rows a fused kernel read in place at an index out of range (and clear the flag for
    the next run). Reads one int from the device: the run's only synchronisation."""
    flag = env[flag_slot]
    code = int(flag.item())
    if code == NO_FLAG:
        return
    flag.fill_(NO_FLAG)
    op = checks[code]
    shapes = ", ".join(f"{t.name}: {tuple(t.shape)} {t.dtype.torch}" for t in op.inputs)
    what = "an index out of range" if op.op == "gather" else "integer division by zero"
    if op.op == "fusion":  # a kernel's own condition, worded by its body's notes
        what = op.attrs["body"].notes.get("flagged", what)
    raise ExecutionError(f"{built_at(op)} failed on inputs [{shapes}]: {what}")
