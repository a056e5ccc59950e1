"""Host-side descriptions of in-kernel tensor operations: the matmul descriptor, execution scopes and tensor views.

Everything here is plain Python (no Triton import): it checks what can be checked before a kernel
is compiled and expands into the compile-time constants (`tl.constexpr` keyword arguments) that
the device functions of `stitchml.shader.language` read.

    >>> d = Matmul2dDescriptor(64, 32, 16)
    >>> d.constexprs(THREAD, prefix="MM_")
    {'MM_M': 64, 'MM_N': 32, 'MM_K': 16, 'MM_TRANSPOSE_LEFT': False, 'MM_TRANSPOSE_RIGHT': False, \
'MM_REDUCED_PRECISION': False, 'MM_SCOPE': 'thread'}
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ShapeError

THREAD = "thread"  # Metal's execution_thread: plain multiply-adds, any extents
PROGRAM = "program"  # Metal's execution_simdgroups / threadgroup: one tl.dot tile over the program's warps
SCOPES = (THREAD, PROGRAM)
MIN_DOT = 16  # tl.dot needs every extent of the tile to be at least this


def check_scope(scope: str, where: str) -> None:
    """Raise ShapeError unless `scope` is one of SCOPES."""
    if scope not in SCOPES:
        raise ShapeError(f"{where}: execution scope must be one of {SCOPES}, got {scope!r}")


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass(frozen=True)
class Matmul2dDescriptor:
    """``C[M, N] = op(A) @ op(B)`` with op(A) of shape (M, K) and op(B) of shape (K, N), as Metal's
    ``matmul2d_descriptor(M, N, K, transpose_left, transpose_right, reduced_precision)``.

    With transpose_left the left operand is stored (K, M); with transpose_right the right one is
    (N, K). reduced_precision lets float32 operands be rounded to float16 before the products
    (a tensor-core dot at program scope); otherwise products and sums are float32. Extents are
    powers of two (Triton's tile extents); program scope needs every extent ≥ 16.
    """

    m: int
    n: int
    k: int
    transpose_left: bool = False
    transpose_right: bool = False
    reduced_precision: bool = False

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not _is_pow2(v):
                raise ShapeError(f"{self}: {name.upper()} must be a power of two ≥ 1 (a Triton tile extent), "
                                 f"got {v!r}")

    def check(self, scope: str) -> None:
        """Raise ShapeError if this descriptor cannot run at `scope` (program scope needs extents ≥ 16)."""
        check_scope(scope, str(self))
        if scope == PROGRAM and min(self.m, self.n, self.k) < MIN_DOT:
            raise ShapeError(f"{self}: program scope compiles to tl.dot, which needs M, N and K ≥ {MIN_DOT}; "
                             f"got M={self.m}, N={self.n}, K={self.k} (use scope 'thread' for small extents)")

    def left_shape(self) -> tuple[int, int]:
        """How the left operand is stored: (M, K), or (K, M) transposed."""
        return (self.k, self.m) if self.transpose_left else (self.m, self.k)

    def right_shape(self) -> tuple[int, int]:
        """How the right operand is stored: (K, N), or (N, K) transposed."""
        return (self.n, self.k) if self.transpose_right else (self.k, self.n)

    def constexprs(self, scope: str, prefix: str = "") -> dict[str, object]:
        """The keyword arguments a kernel declaring ``{prefix}M: tl.constexpr, ...`` is launched with; checked first."""
        self.check(scope)
        return {f"{prefix}M": self.m, f"{prefix}N": self.n, f"{prefix}K": self.k,
                f"{prefix}TRANSPOSE_LEFT": self.transpose_left, f"{prefix}TRANSPOSE_RIGHT": self.transpose_right,
                f"{prefix}REDUCED_PRECISION": self.reduced_precision, f"{prefix}SCOPE": scope}


@dataclass(frozen=True)
class TensorView:
    """A strided view of a buffer as a kernel reads it (Metal's inline tensor): extents and strides in
    elements, outermost first, a dtype and an element offset into the buffer.

    >>> v = TensorView.contiguous((4, 8, 3), torch.int8)
    >>> v.rank, v.strides, v.numel
    (3, (24, 3, 1), 96)
    """

    extents: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    offset: int = 0

    def __post_init__(self) -> None:
        if len(self.extents) != len(self.strides):
            raise ShapeError(f"TensorView: expected one stride per extent, got extents {self.extents} and "
                             f"strides {self.strides}")
        if any(e < 0 for e in self.extents) or any(s < 0 for s in self.strides) or self.offset < 0:
            raise ShapeError(f"TensorView: extents, strides and offset must be ≥ 0, got {self.extents}, "
                             f"{self.strides}, {self.offset}")

    @classmethod
    def contiguous(cls, extents: tuple[int, ...], dtype: torch.dtype, offset: int = 0) -> "TensorView":
        """Row-major extents (innermost stride 1) starting `offset` elements into the buffer."""
        strides, step = [], 1
        for e in reversed(extents):
            strides.append(step)
            step *= e
        return cls(tuple(extents), tuple(reversed(strides)), dtype, offset)

    @property
    def rank(self) -> int:
        return len(self.extents)

    @property
    def numel(self) -> int:
        n = 1
        for e in self.extents:
            n *= e
        return n

    def span(self) -> int:
        """Elements from the buffer's start to one past the last element the view reaches."""
        if self.numel == 0:
            return self.offset
        return self.offset + sum((e - 1) * s for e, s in zip(self.extents, self.strides)) + 1

    def of(self, buffer: torch.Tensor) -> torch.Tensor:
        """The view over a flat `buffer` as a torch tensor (what a kernel reading this view sees)."""
        if buffer.dim() != 1 or buffer.dtype != self.dtype or buffer.numel() < self.span():
            raise ShapeError(f"TensorView {self.extents}/{self.strides}+{self.offset} of {self.dtype}: expected a "
                             f"flat {self.dtype} buffer of at least {self.span()} elements, got "
                             f"{tuple(buffer.shape)} {buffer.dtype}")
        return buffer.as_strided(self.extents, self.strides, self.offset)
