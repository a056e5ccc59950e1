"""Dataset loading: the IDX reader on good and damaged files made here, MNIST if present, 8x8 digits."""
import doctest
import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

import stitchml as sm
from stitchml import data

MNIST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "mnist"


def _idx(array: np.ndarray, code: int = 0x08) -> bytes:
    dtype = {0x08: ">u1", 0x0B: ">i2", 0x0D: ">f4"}[code]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(dtype).tobytes()


def _write(path: Path, payload: bytes, compress: bool) -> Path:
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


IMAGES = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
LABELS = np.array([3, 9], np.uint8)


@pytest.mark.parametrize("compress", [False, True])
def test_reads_idx_files_plain_and_gzipped(tmp_path, compress):
    images = data.read_idx(_write(tmp_path / "i", _idx(IMAGES), compress), data.MNIST_IMAGES_MAGIC)
    assert images.dtype == np.uint8 and images.shape == (2, 3, 4) and (images == IMAGES).all()
    floats = np.array([[1.5, -2.25]], np.float32)
    assert (data.read_idx(_write(tmp_path / "f", _idx(floats, 0x0D), compress)) == floats).all()
    shorts = np.array([-7, 300], np.int16)
    out = data.read_idx(_write(tmp_path / "s", _idx(shorts, 0x0B), compress))
    assert out.dtype == np.int16 and out.tolist() == [-7, 300]


DAMAGED = {
    "truncated data": (lambda b: b[:-3], False, r"truncated: expected 24 bytes of data for shape \(2, 3, 4\), found 21"),
    "truncated header": (lambda b: b[:9], False, r"truncated: expected 12 bytes of the 3 dimension sizes, found 5"),
    "empty file": (lambda b: b"", False, "truncated: expected 4 bytes of magic number, found 0"),
    "trailing bytes": (lambda b: b + b"\0", False, r"found more after them"),
    "labels for images": (lambda b: _idx(LABELS), False,
                          r"expected magic number 2051 \(0x00000803: >u1 elements, 3 dimensions\), found 2049"),
    "four dimensions": (lambda b: _idx(IMAGES[None]), False, r"found 2052 \(0x00000804: >u1 elements, 4 dimensions\)"),
    "a PNG": (lambda b: b"\x89PNG\r\n\x1a\n" + b, False, r"found 2303741511 \(0x89504e47"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_rejects_damaged_idx_files(tmp_path, case):
    damage, compress, message = DAMAGED[case]
    path = _write(tmp_path / "train-images-idx3-ubyte", damage(_idx(IMAGES)), compress)
    with pytest.raises(sm.DataError, match=message) as err:
        data.read_idx(path, data.MNIST_IMAGES_MAGIC)
    assert str(path) in str(err.value) and isinstance(err.value, sm.StitchError)


def test_rejects_unknown_idx_type_without_an_expected_magic(tmp_path):
    path = _write(tmp_path / "x", bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 5]), False)
    with pytest.raises(sm.DataError, match="not an IDX file: .*found 0x00004201"):
        data.read_idx(path)


def test_rejects_truncated_and_corrupt_gzip(tmp_path):
    packed = gzip.compress(_idx(np.random.default_rng(0).integers(0, 255, (50, 28, 28)).astype(np.uint8)))
    truncated = _write(tmp_path / "truncated.gz", packed[: len(packed) // 2], False)
    with pytest.raises(sm.DataError, match="gzip stream is damaged or truncated"):
        data.read_idx(truncated, data.MNIST_IMAGES_MAGIC)
    corrupt = bytearray(packed)
    corrupt[-6] ^= 0xFF  # inside the CRC32 trailer: only the integrity check can notice
    with pytest.raises(sm.DataError, match="gzip stream is damaged"):
        data.read_idx(_write(tmp_path / "crc.gz", bytes(corrupt), False), data.MNIST_IMAGES_MAGIC)
    corrupt = bytearray(packed)
    corrupt[len(packed) // 2] ^= 0x55
    with pytest.raises(sm.DataError, match="gzip stream is damaged"):
        data.read_idx(_write(tmp_path / "body.gz", bytes(corrupt), False), data.MNIST_IMAGES_MAGIC)


def test_a_header_claiming_huge_sizes_fails_fast(tmp_path):
    path = _write(tmp_path / "huge", bytes([0, 0, 8, 3]) + struct.pack(">3I", 2**31, 2**31, 2**31) + b"x" * 10, False)
    with pytest.raises(sm.DataError, match="truncated: expected 9903520314283042199192993792 bytes"):
        data.read_idx(path)


def _mnist_folder(folder, train_labels=LABELS, compress=True):
    folder.mkdir(exist_ok=True)
    suffix = ".gz" if compress else ""
    for prefix, labels in (("train", train_labels), ("t10k", LABELS)):
        _write(folder / f"{prefix}-images-idx3-ubyte{suffix}", _idx(IMAGES), compress)
        _write(folder / f"{prefix}-labels-idx1-ubyte{suffix}", _idx(labels), compress)
    return folder


@pytest.mark.parametrize("compress", [False, True])
def test_load_mnist_from_a_folder(tmp_path, compress):
    d = data.load_mnist(_mnist_folder(tmp_path, compress=compress))
    assert d.train_images.shape == (2, 1, 3, 4) and d.train_images.dtype == np.float32
    np.testing.assert_array_equal(d.train_images[:, 0], IMAGES / np.float32(255))
    assert d.test_labels.dtype == np.int64 and d.test_labels.tolist() == [3, 9]


def test_load_mnist_rejects_inconsistent_folders(tmp_path):
    with pytest.raises(sm.DataError, match="expected one label per image .*\\(2\\), found 3"):
        data.load_mnist(_mnist_folder(tmp_path / "a", np.array([1, 2, 3], np.uint8)))
    with pytest.raises(sm.DataError, match="expected digit labels 0-9, found 12"):
        data.load_mnist(_mnist_folder(tmp_path / "b", np.array([1, 12], np.uint8)))
    (tmp_path / "c").mkdir()
    with pytest.raises(sm.DataError, match="expected the MNIST file train-images-idx3-ubyte.gz"):
        data.load_mnist(tmp_path / "c")
    with pytest.raises(sm.DataError, match="expected a folder holding the MNIST IDX files"):
        data.load_mnist(tmp_path / "missing")


@pytest.mark.skipif(not MNIST.is_dir(), reason="the shared MNIST files are not beside this checkout")
def test_the_shared_mnist_test_split():
    labels = data.read_idx(MNIST / "t10k-labels-idx1-ubyte.gz", data.MNIST_LABELS_MAGIC)
    images = data.read_idx(MNIST / "t10k-images-idx3-ubyte.gz", data.MNIST_IMAGES_MAGIC)
    assert images.shape == (10000, 28, 28) and labels.shape == (10000,)
    assert np.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_digits_split_is_stratified_and_seeded():
    a, b, c = data.load_digits(seed=0), data.load_digits(seed=0), data.load_digits(seed=1)
    assert a.train_images.shape == (1437, 1, 8, 8) and a.test_images.shape == (360, 1, 8, 8)
    assert a.train_images.min() == 0.0 and a.train_images.max() == 1.0
    assert np.array_equal(a.test_labels, b.test_labels) and not np.array_equal(a.test_labels, c.test_labels)
    assert np.bincount(a.test_labels).min() >= 35  # every class held out in proportion


@pytest.mark.parametrize("fraction, seed", [(0.2, 0), (0.2, 1), (0.3, 7)])
def test_digits_are_scikit_learns_split(fraction, seed):
    # read and split without importing scikit-learn: the very arrays its load_digits and train_test_split give
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[:, None]
    expected = train_test_split(images, digits.target.astype(np.int64), test_size=fraction, random_state=seed,
                                stratify=digits.target)
    got = data.load_digits(test_fraction=fraction, seed=seed)
    for want, have in zip(expected, (got.train_images, got.test_images, got.train_labels, got.test_labels)):
        assert want.dtype == have.dtype and np.array_equal(want, have)


def test_batches_cover_every_example_once():
    rng = np.random.default_rng(0)
    x, y = np.arange(10)[:, None], np.arange(10)
    seen = [yb for _, yb in data.batches(x, y, 4, rng)]
    assert [len(s) for s in seen] == [4, 4, 2]
    assert sorted(np.concatenate(seen).tolist()) == list(range(10)) and np.concatenate(seen).tolist() != list(range(10))
    assert all((xb[:, 0] == yb).all() for xb, yb in data.batches(x, y, 3, rng))


def test_docstring_examples_run():
    failures, tried = doctest.testmod(data)
    assert tried > 0 and failures == 0
