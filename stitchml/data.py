"""Datasets for the demos and tests: MNIST's IDX files and scikit-learn's 8x8 digits.

Nothing is downloaded: MNIST is read from a folder the caller names, the 8x8
digits ship inside scikit-learn. Images come back as float32 arrays shaped
(N, 1, H, W) with values in [0, 1], labels as int64 arrays shaped (N,).

A damaged file raises `DataError` saying what was expected, what was found and
in which file: a wrong magic number, a dimension count or size that does not
match the header, a truncated or corrupt gzip stream.

    >>> from stitchml import data
    >>> d = data.load_digits(seed=0)
    >>> d.train_images.shape[1:], d.train_images.dtype.name, len(d.train_labels) + len(d.test_labels)
    ((1, 8, 8), 'float32', 1797)
"""
from __future__ import annotations

import gzip
import importlib.util
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from .errors import DataError

# IDX type codes (the third byte of the magic number) and the big-endian element types they name.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
MNIST_IMAGES_MAGIC = 0x0803  # unsigned bytes, 3 dimensions (count, rows, columns)
MNIST_LABELS_MAGIC = 0x0801  # unsigned bytes, 1 dimension (count)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Dataset:
    """Images (N, 1, H, W) float32 in [0, 1] and int64 labels, split into train and test."""

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    classes: int = 10

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])

    def subset(self, train: int, test: int) -> "Dataset":
        """The first `train` training and `test` test examples (quick runs and tests)."""
        return Dataset(self.name, self.train_images[:train], self.train_labels[:train], self.test_images[:test],
                       self.test_labels[:test], self.classes)


def _describe_magic(magic: int) -> str:
    code, rank = (magic >> 8) & 0xFF, magic & 0xFF
    kind = _IDX_TYPES.get(code, "an unknown type")
    return f"{magic} (0x{magic:08x}: {kind} elements, {rank} dimensions)"


def _read_exactly(stream: BinaryIO, n: int, path: Path, what: str) -> bytes:
    """`n` bytes, read in chunks so that a damaged header cannot make us allocate its claim up front."""
    parts, have = [], 0
    while have < n:
        part = stream.read(min(_CHUNK, n - have))
        if not part:
            raise DataError(f"{path}: truncated: expected {n} bytes of {what}, found {have}")
        parts.append(part)
        have += len(part)
    return b"".join(parts)


def _parse_idx(stream: BinaryIO, path: Path, magic: int | None) -> np.ndarray:
    header = _read_exactly(stream, 4, path, "magic number")
    found = int.from_bytes(header, "big")
    if magic is not None and found != magic:
        raise DataError(f"{path}: expected magic number {_describe_magic(magic)}, found {_describe_magic(found)}")
    if header[:2] != b"\0\0" or header[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file: expected a magic number 0x0000TTNN with type code TT in "
                        f"{sorted(hex(c) for c in _IDX_TYPES)}, found 0x{found:08x}")
    rank = header[3]
    dims = struct.unpack(f">{rank}I", _read_exactly(stream, 4 * rank, path, f"the {rank} dimension sizes"))
    dtype = np.dtype(_IDX_TYPES[header[2]])
    size = math.prod(dims) * dtype.itemsize
    body = _read_exactly(stream, size, path, f"data for shape {dims}")
    if stream.read(1):
        raise DataError(f"{path}: expected {size} bytes of data for shape {dims}, found more after them")
    return np.frombuffer(body, dtype).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx(path: str | os.PathLike, magic: int | None = None) -> np.ndarray:
    """Read an IDX file, gzip-compressed or not (told apart by content, not by name).

    `magic`, when given, is the exact magic number expected (MNIST_IMAGES_MAGIC, say).
    Raises DataError for a missing, truncated, corrupt or mismatched file.

    >>> import gzip, os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "x.gz")
    >>> with gzip.open(p, "wb") as f: _ = f.write(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
    >>> read_idx(p, magic=MNIST_LABELS_MAGIC).tolist()
    [7, 8, 9]
    """
    path = Path(path)
    try:
        raw = path.open("rb")
    except OSError as e:
        raise DataError(f"{path}: cannot open the file ({e.strerror})") from None
    with raw:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not compressed:
            return _parse_idx(raw, path, magic)
        try:
            with gzip.GzipFile(fileobj=raw) as stream:
                return _parse_idx(stream, path, magic)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise DataError(f"{path}: the gzip stream is damaged or truncated ({e})") from None


def _find(directory: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (directory / name).is_file():
            return directory / name
    raise DataError(f"{directory}: expected the MNIST file {stem}.gz (or {stem}), found neither")


def _split(directory: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    images_path = _find(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(directory, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, MNIST_IMAGES_MAGIC)
    labels = read_idx(labels_path, MNIST_LABELS_MAGIC)
    if len(images) != len(labels):
        raise DataError(f"{labels_path}: expected one label per image of {images_path.name} ({len(images)}), "
                        f"found {len(labels)}")
    if labels.size and labels.max() > 9:
        raise DataError(f"{labels_path}: expected digit labels 0-9, found {int(labels.max())}")
    return (images.astype(np.float32) / 255.0)[:, None], labels.astype(np.int64)


def load_mnist(directory: str | os.PathLike) -> Dataset:
    """MNIST from its four IDX files in `directory` (train-images-idx3-ubyte.gz and the others,
    each gzip-compressed or not)::

        d = load_mnist("../shared/data/mnist")
        d.train_images.shape, d.test_images.shape   # (60000, 1, 28, 28), (10000, 1, 28, 28)
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: expected a folder holding the MNIST IDX files, found no such folder")
    train_images, train_labels = _split(directory, "train")
    test_images, test_labels = _split(directory, "t10k")
    return Dataset("mnist", train_images, train_labels, test_images, test_labels)


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images), split into train and held-out test sets,
    stratified by class with `seed`.

    The bundled file is read and split here, exactly as scikit-learn's `load_digits` and its stratified
    `train_test_split` would (the same arrays: tests/test_data.py compares them), without importing
    scikit-learn, whose import takes longer than a quarter of the digits demo."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the 8x8 digits ship with scikit-learn, which is not installed: "
                        "pip install scikit-learn (or stitchml[cli])")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"{path}: expected scikit-learn's 8x8 digits (digits.csv.gz), found no such file")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    target = table[:, -1].astype(int)
    images = (table[:, :-1].reshape(-1, 8, 8).astype(np.float32) / 16.0)[:, None]
    train, test = _stratified_split(target, test_fraction, seed)
    labels = target.astype(np.int64)
    return Dataset("digits", images[train], labels[train], images[test], labels[test])


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices as scikit-learn's StratifiedShuffleSplit draws them with `random_state=seed`:
    each class's share of each side by `_approximate_mode`, ties broken by the same generator, the same
    draws in the same order."""
    n_test = math.ceil(test_fraction * len(y))
    n_train = len(y) - n_test
    _, y_indices, class_counts = np.unique(y, return_inverse=True, return_counts=True)
    class_indices = np.split(np.argsort(y_indices, kind="stable"), np.cumsum(class_counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(class_counts, n_train, rng)
    t_i = _approximate_mode(class_counts - n_i, n_test, rng)
    train: list = []
    test: list = []
    for i, count in enumerate(class_counts):
        order = class_indices[i].take(rng.permutation(count), mode="clip")
        train.extend(order[:n_i[i]])
        test.extend(order[n_i[i]:n_i[i] + t_i[i]])
    return rng.permutation(train), rng.permutation(test)


def _approximate_mode(class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of `n_draws` each class gets: the floor of its share, then one more for the largest
    remainders, ties drawn at random (scikit-learn's sklearn.utils.extmath._approximate_mode)."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need = int(n_draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add = min(len(inds), need)
            floored[rng.choice(inds, size=add, replace=False)] += 1
            need -= add
            if need == 0:
                break
    return floored.astype(int)


def batches(images: np.ndarray, labels: np.ndarray, batch_size: int,
            rng: np.random.Generator | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Consecutive (images, labels) batches, shuffled by `rng` when given; the last may be smaller.

    >>> [len(y) for _, y in batches(np.zeros((5, 1)), np.arange(5), 2)]
    [2, 2, 1]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = rng.permutation(len(images)) if rng is not None else np.arange(len(images))
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        yield np.ascontiguousarray(images[index]), np.ascontiguousarray(labels[index])


__all__ = ["Dataset", "DataError", "read_idx", "load_mnist", "load_digits", "batches",
           "MNIST_IMAGES_MAGIC", "MNIST_LABELS_MAGIC"]
