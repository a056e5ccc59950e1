"""Random primitives: uniform and normal draws from a seeded generator.

A random op is reproducible: run k of a graph draws the same numbers for the
same seed on the same device, and different runs draw different numbers (the
generator is seeded with (seed, run index)), so dropout masks change from one
training step to the next while a fresh graph replays the same sequence.
`seed=None` picks a seed when the op is built and stores it in the IR.
"""
from __future__ import annotations

import hashlib
import secrets

import torch

from .. import dtypes
from ..errors import ShapeError
from ..ir import Tensor, TensorType
from ..registry import RANDOM, Primitive, builder, register


def generator_for(seed: int, run_index: int, device: torch.device) -> torch.Generator:
    """The generator a random op of `seed` uses in run `run_index`."""
    digest = hashlib.blake2b(f"{seed}:{run_index}".encode(), digest_size=8).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
    return gen


def _infer(types, seed, dtype, shape=None, **params):
    if not dtypes.as_dtype(dtype).is_floating:
        raise ShapeError(f"random values need a floating-point dtype, got {dtype}")
    return TensorType(types[0].shape if shape is None else shape, dtype)


def _draw(fill):
    def impl(ctx, like=None, *, seed, dtype, shape=None, **params):
        shape = tuple(like.shape) if shape is None else tuple(shape)
        gen = generator_for(seed, ctx.run_index, ctx.device)
        out = torch.empty(shape, dtype=torch.float32, device=ctx.device)
        fill(out, gen, **params)
        return out.to(dtypes.as_dtype(dtype).torch)

    return impl


random_uniform = register(Primitive(
    "random_uniform", RANDOM, infer=_infer, differentiable=False,
    impl=_draw(lambda out, gen, minimum, maximum: out.uniform_(minimum, maximum, generator=gen)),
    needs_context=True, doc="Uniform values in [minimum, maximum).",
))
random_normal = register(Primitive(
    "random_normal", RANDOM, infer=_infer, differentiable=False,
    impl=_draw(lambda out, gen, mean, standard_deviation: out.normal_(mean, standard_deviation, generator=gen)),
    needs_context=True, doc="Normal values with the given mean and standard deviation.",
))


def _emit_random(g, op, shape, seed, dtype, params, name):
    seed = secrets.randbits(31) if seed is None else int(seed)
    try:
        dtype = dtypes.as_dtype(dtype)
    except TypeError as e:
        raise g._error(op, str(e)) from None
    attrs = {"seed": seed, "dtype": dtype, **params}
    if isinstance(shape, Tensor):
        return g._emit1(op, [shape], attrs, name)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise g._error(op, f"shape {shape} must be static; pass a tensor to draw in its run-time shape")
    return g._emit1(op, [], {**attrs, "shape": shape}, name)


@builder("random_uniform")
def _random_uniform(g, shape, seed=None, dtype=dtypes.float32, minimum=0.0, maximum=1.0, name=None):
    """Uniform draws of `shape` (a tuple, or a tensor whose run-time shape to take)."""
    return _emit_random(g, "random_uniform", shape, seed, dtype, {"minimum": float(minimum), "maximum": float(maximum)}, name)


@builder("random_normal")
def _random_normal(g, shape, seed=None, dtype=dtypes.float32, mean=0.0, standard_deviation=1.0, name=None):
    """Normal draws of `shape` (a tuple, or a tensor whose run-time shape to take)."""
    params = {"mean": float(mean), "standard_deviation": float(standard_deviation)}
    return _emit_random(g, "random_normal", shape, seed, dtype, params, name)
