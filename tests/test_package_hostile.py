"""Hostile package files: special files, links, oversized parts, hostile numbers and attributes in the IR.

Each ends in PackageError, quickly, without reading an oversized part: a FIFO once blocked the loader forever,
a sparse multi-GB part was read whole, and several IR values escaped as ValueError, OverflowError,
ZeroDivisionError or RuntimeError.
"""
import json
import os
import signal
import time

import numpy as np
import pytest

import stitchml as sm
from stitchml.ops import Convolution2DDescriptor
from stitchml.package import Limits, Package, container


@pytest.fixture(autouse=True)
def deadline():
    """Fail (rather than hang) a test that takes more than 20 s: reading a FIFO once blocked forever."""
    def expire(*_):
        raise TimeoutError("the loader ran past the test's 20 s deadline")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _package() -> Package:
    g = sm.Graph()
    x = g.placeholder((-1, 1, 4, 4), sm.float32, name="x")
    w = g.constant(np.ones((2, 1, 3, 3), np.float32))
    y = g.convolution2d(x, w, Convolution2DDescriptor(stride=(1, 1)))
    return Package.from_graph(g, {"x": x}, {"y": g.reduction_sum(y, (2, 3), True)})


def _dir_package(tmp_path):
    d = tmp_path / "pkg"
    _package().save(str(d) + "/")
    return d


def _set_manifest_size(d, part, size):
    doc = json.loads((d / "manifest.json").read_bytes())
    doc["parts"][part]["size"] = size
    (d / "manifest.json").write_text(json.dumps(doc))


def test_fifo_part_is_refused_without_blocking(tmp_path):
    d = _dir_package(tmp_path)
    os.remove(d / "functions" / "main.json")
    os.mkfifo(d / "functions" / "main.json")
    with pytest.raises(sm.PackageError, match="'functions/main.json' is a FIFO"):
        sm.load_package(d)


def test_link_to_a_fifo_inside_is_refused(tmp_path):
    d = _dir_package(tmp_path)
    os.mkfifo(d / "functions" / "pipe")
    os.remove(d / "functions" / "main.json")
    os.symlink("pipe", d / "functions" / "main.json")
    with pytest.raises(sm.PackageError, match="FIFO"):
        sm.load_package(d)


def test_package_path_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "m.smpkg")
    with pytest.raises(sm.PackageError, match="FIFO"):
        sm.load_package(tmp_path / "m.smpkg")


def test_link_loop_is_refused(tmp_path):
    d = _dir_package(tmp_path)
    os.remove(d / "functions" / "main.json")
    os.symlink("loop", d / "functions" / "main.json")
    os.symlink("main.json", d / "functions" / "loop")
    with pytest.raises(sm.PackageError, match="loops or leads nowhere"):
        sm.load_package(d)


def test_link_to_a_device_is_refused(tmp_path):
    d = _dir_package(tmp_path)
    os.remove(d / "functions" / "main.json")
    os.symlink("/dev/zero", d / "functions" / "main.json")
    with pytest.raises(sm.PackageError, match="outside the package"):
        sm.load_package(d)


def test_links_to_regular_files_inside_still_load(tmp_path):
    d = _dir_package(tmp_path)
    os.rename(d / "functions" / "main.json", d / "functions" / "real")
    os.symlink("real", d / "functions" / "main.json")
    with pytest.raises(sm.PackageError, match=r"not listed in the manifest: \['functions/real'\]"):
        sm.load_package(d)  # the link's target is a file of its own, so it must be listed too


def test_sparse_part_over_the_default_limit_is_refused_before_reading(tmp_path):
    d = _dir_package(tmp_path)
    size = sm.package.default_limits().max_part_bytes + 1
    with open(d / "functions" / "main.safetensors", "wb") as f:
        f.truncate(size)  # sparse: no disk, but reading it costs the whole size in memory
    _set_manifest_size(d, "functions/main.safetensors", size)
    start = time.perf_counter()
    with pytest.raises(sm.PackageError, match="max_part_bytes"):
        sm.load_package(d)
    assert time.perf_counter() - start < 2.0


def test_part_over_a_configured_limit_is_refused(tmp_path):
    _package().save(tmp_path / "m.smpkg")
    with pytest.raises(sm.PackageError, match="part 'functions/main.json''s size in bytes: [0-9]+ is over the limit "
                                              "max_part_bytes=100"):
        sm.load_package(tmp_path / "m.smpkg", limits=Limits(max_part_bytes=100))
    with pytest.raises(sm.PackageError, match="max_package_bytes=1000"):
        sm.load_package(tmp_path / "m.smpkg", limits=Limits(max_package_bytes=1000))
    assert sm.load_package(tmp_path / "m.smpkg").function().outputs[0].name == "y"


def _with_graph_text(tmp_path, edit) -> str:
    """A zip package whose IR text went through edit(text) -> text, with valid hashes (as an attacker writes it)."""
    manifest, parts = _package().manifest_and_parts()
    parts["functions/main.json"] = edit(parts["functions/main.json"].decode()).encode()
    path = tmp_path / "m.smpkg"
    container.write(path, manifest, parts)
    return path


def test_4301_digit_integer_is_refused(tmp_path):
    path = _with_graph_text(tmp_path, lambda t: t.replace('"groups":1', '"groups":' + "9" * 4301))
    with pytest.raises(sm.PackageError, match=r"integer 9+\.\.\. \(4301 characters\) is outside the 64-bit range"):
        sm.load_package(path)


@pytest.mark.parametrize("old, new", [
    ('"axes":[2,3]', '"axes":[{"$float":"inf"},3]'),  # an attribute's int
    ('"shape":[-1,1,4,4]', '"shape":[-1,{"$float":"-inf"},4,4]'),  # the placeholder's extents
    ('"groups":1', '"groups":{"$float":"nan"}'),
    ('"groups":1', '"groups":1e999'),  # JSON that Python reads as inf
    ('"groups":1', '"groups":Infinity'),  # not JSON, but Python's json module reads it
])
def test_non_finite_number_where_an_int_belongs_is_refused(tmp_path, old, new):
    path = _with_graph_text(tmp_path, lambda t: t.replace(old, new, 1))
    with pytest.raises(sm.PackageError):
        sm.load_package(path)


@pytest.mark.parametrize("stride", ["[0,1]", "[1,-1]"])
def test_zero_or_negative_stride_is_refused(tmp_path, stride):
    path = _with_graph_text(tmp_path, lambda t: t.replace('"stride":[1,1]', '"stride":' + stride))
    with pytest.raises(sm.PackageError, match="convolution2d"):
        sm.load_package(path)


def test_tensor_given_as_keep_dims_is_refused(tmp_path):
    path = _with_graph_text(tmp_path, lambda t: t.replace('"keep_dims":true', '"keep_dims":{"$tensor":"op1.value"}'))
    with pytest.raises(sm.PackageError, match="reduction_sum"):
        sm.load_package(path)


def test_bool_where_a_size_belongs_is_refused(tmp_path):
    manifest, parts = _package().manifest_and_parts()
    parts["extra.bin"] = b"x"
    path = tmp_path / "m.smpkg"
    container.write(path, manifest, parts)
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    doc = json.loads(members["manifest.json"])
    doc["parts"]["extra.bin"]["size"] = True  # JSON true equals 1 in Python; it is no size
    members["manifest.json"] = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(sm.PackageError, match="'size': int >= 0"):
        sm.load_package(path)


def test_tensor_with_more_elements_than_the_limit_is_refused(tmp_path):
    path = _with_graph_text(tmp_path, lambda t: t)
    with pytest.raises(sm.PackageError, match="max_tensor_elements=10"):
        sm.load_package(path, limits=Limits(max_tensor_elements=10))


def test_archive_whose_directory_is_too_large_to_parse_is_refused(tmp_path):
    import zipfile

    path = tmp_path / "m.smpkg"
    with zipfile.ZipFile(path, "w") as z:  # 80 records of 60 KB each: zipfile would parse them all first
        for i in range(80):
            info = zipfile.ZipInfo(f"p/{i}")
            info.extra = (0xCAFE).to_bytes(2, "little") + (59996).to_bytes(2, "little") + bytes(59996)
            z.writestr(info, b"")
    with pytest.raises(sm.PackageError, match="directory is [0-9]+ bytes, over"):
        sm.load_package(path)


def test_zip64_archive_still_loads(tmp_path):
    import zipfile

    manifest, parts = _package().manifest_and_parts()
    manifest["parts"] = {n: {"size": len(d), "sha256": container.sha256(d)} for n, d in parts.items()}
    path = tmp_path / "m.smpkg"
    with zipfile.ZipFile(path, "w", allowZip64=True) as z:
        for name, data in [("manifest.json", json.dumps(manifest).encode()), *parts.items()]:
            with z.open(name, "w", force_zip64=True) as f:
                f.write(data)
    assert sm.load_package(path).function().outputs[0].name == "y"
