"""The package format: round trips, the kernel slot, inspect, and every way a hostile file is refused."""
import json
import os
import zipfile

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.package import Package, container, current_target, kernels
from stitchml.package import package as package_mod


def _package() -> Package:
    g = sm.Graph()
    x = g.placeholder((-1, 3), sm.float32, name="x")
    w = g.constant(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    return Package.from_graph(g, {"x": x}, {"y": g.tanh(x @ w)}, dim_names={"x": ["batch", None]})


def _expected(x):
    return np.tanh(x @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10))


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.smpkg"
    _package().save(path)
    return path


def _rewrite(path, mutate):
    """Rewrite a zip package member by member through mutate(name, bytes) -> bytes | None (None drops it)."""
    with zipfile.ZipFile(path) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members:
            data = mutate(name, data)
            if data is not None:
                z.writestr(name, data)


def _manifest_edit(path, edit):
    def mutate(name, data):
        if name != container.MANIFEST:
            return data
        doc = json.loads(data)
        edit(doc)
        return json.dumps(doc).encode()

    _rewrite(path, mutate)


# -- round trips ------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["file", "dir"])
def test_roundtrip_runs_the_same(tmp_path, form):
    path = str(tmp_path / "m.smpkg") + ("/" if form == "dir" else "")
    _package().save(path)
    fn = sm.load_package(path).function("main")
    x = np.random.rand(5, 3).astype(np.float32)
    np.testing.assert_allclose(fn(x=x)["y"].numpy(), _expected(x), rtol=1e-6)
    assert str(fn.inputs[0]) == "x: float32[batch, 3]"
    assert fn.outputs[0].type == sm.TensorType((-1, 4), sm.float32)


def test_manifest_lists_hash_and_size_of_every_part(saved):
    with zipfile.ZipFile(saved) as z:
        manifest = json.loads(z.read("manifest.json"))
        names = {i.filename for i in z.infolist()} - {"manifest.json"}
        assert set(manifest["parts"]) == names
        for name, entry in manifest["parts"].items():
            assert entry["size"] == z.getinfo(name).file_size
            assert entry["sha256"] == container.sha256(z.read(name))
    assert manifest["format"] == "stitchml.package" and manifest["version"] == 1
    assert manifest["functions"]["main"]["inputs"][0]["shape"] == [-1, 3]


def test_function_checks_its_inputs():
    fn = _package().function()
    with pytest.raises(sm.FeedError, match=r"x: float32\[batch, 3\]"):
        fn(x=np.zeros((2, 4), np.float32))
    with pytest.raises(sm.FeedError, match="no inputs named"):
        fn(x=np.zeros((2, 3), np.float32), z=1)
    with pytest.raises(sm.FeedError, match="missing"):
        fn()
    with pytest.raises(sm.PackageError, match="no function 'other'"):
        _package().function("other")


def test_inspect_summary(saved):
    text = sm.load_package(saved).summary()
    assert "x: float32[batch, 3]" in text and "matrix_multiplication" in text and "48 B" in text


def test_cli_build_and_inspect(tmp_path, capsys):
    from onnx import TensorProto, helper

    from stitchml.cli import main

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    onnx_path = tmp_path / "relu.onnx"
    onnx_path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert main(["package", "build", str(onnx_path), "-o", str(tmp_path / "relu.smpkg")]) == 0
    assert main(["package", "inspect", str(tmp_path / "relu.smpkg")]) == 0
    assert "x: float32[n, 2]" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["package", "inspect", str(tmp_path / "missing.smpkg")])
    assert exit_.value.code == 2 and "missing.smpkg': no such file or directory" in capsys.readouterr().err


# -- compiled kernels slot ---------------------------------------------------------------------
def test_kernels_found_for_matching_target_only(tmp_path):
    pkg = _package()
    here = current_target("cpu")
    sm90 = {"arch": "sm_90", "triton": "3.6.0"}
    mine = kernels.pack(kernels.Bundle(here, {"by": "test"}, {}, {}))
    pkg.add_kernels("main", {"x": (8, 3)}, here, mine, compiler="test")
    pkg.add_kernels("main", {"x": (8, 3)}, sm90, kernels.pack(kernels.Bundle(sm90, {}, {}, {})))
    pkg.save(tmp_path / "k.smpkg")
    loaded = sm.load_package(tmp_path / "k.smpkg")
    blob, why = loaded.find_kernels("main", {"x": (8, 3)}, here)
    assert blob == mine
    blob, why = loaded.find_kernels("main", {"x": (8, 3)}, {"arch": "sm_80", "triton": "3.6.0"})
    assert blob is None and "sm_90" in why and "sm_80" in why
    blob, why = loaded.find_kernels("main", {"x": (4, 3)}, here)  # other extents: the size-generic kernels serve
    assert blob == mine and why.endswith("at x=[8, 3], serving other sizes")
    blob, why = loaded.find_kernels("main", {"x": (4, 3, 1)}, here)
    assert blob is None and "no compiled kernels" in why
    assert "compiled kernels" in loaded.summary() and "sm_90" in loaded.summary()


# -- hostile and damaged files ------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(sm.PackageError, match="no such package"):
        sm.load_package(tmp_path / "none.smpkg")


def test_not_a_zip(tmp_path):
    p = tmp_path / "junk.smpkg"
    p.write_bytes(b"not a zip at all" * 10)
    with pytest.raises(sm.PackageError, match="not a readable package archive"):
        sm.load_package(p)


def test_truncated_file(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(sm.PackageError):
        sm.load_package(saved)


def test_corrupted_part_fails_its_hash(saved):
    def flip(name, data):
        if name.endswith(".safetensors"):
            data = bytearray(data)
            data[-1] ^= 0xFF
        return bytes(data)

    _rewrite(saved, flip)
    with pytest.raises(sm.PackageError, match="corrupted: SHA-256"):
        sm.load_package(saved)


def test_size_mismatch(saved):
    _manifest_edit(saved, lambda d: d["parts"]["functions/main.json"].update(size=1))
    with pytest.raises(sm.PackageError, match="the manifest says 1"):
        sm.load_package(saved)


def test_missing_part(saved):
    _rewrite(saved, lambda n, d: None if n == "functions/main.safetensors" else d)
    with pytest.raises(sm.PackageError, match="missing"):
        sm.load_package(saved)


def test_unlisted_extra_file(saved):
    with zipfile.ZipFile(saved, "a", zipfile.ZIP_STORED) as z:
        z.writestr("extra.bin", b"x")
    with pytest.raises(sm.PackageError, match="not listed"):
        sm.load_package(saved)


@pytest.mark.parametrize("name", ["../evil", "/abs/path", "a/../../b", "a\\b", "."])
def test_paths_leaving_the_package(tmp_path, name):
    p = tmp_path / "evil.smpkg"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("manifest.json", b"{}")
        z.writestr(name, b"x")
    with pytest.raises(sm.PackageError, match="part path"):
        sm.load_package(p)


def test_manifest_part_path_traversal(saved):
    _manifest_edit(saved, lambda d: d["parts"].update({"../../etc/passwd": {"size": 1, "sha256": "00"}}))
    with pytest.raises(sm.PackageError, match="part path"):
        sm.load_package(saved)


def test_compressed_members_are_refused(tmp_path):
    p = tmp_path / "bomb.smpkg"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", b'{"parts": {}}')
        z.writestr("functions/main.json", b"\0" * (50 << 20))  # 50 MiB of zeros: a few KiB compressed
    assert os.path.getsize(p) < 1 << 20
    with pytest.raises(sm.PackageError, match="compressed"):
        sm.load_package(p)


def test_members_claiming_more_than_the_archive(tmp_path, saved):
    raw = bytearray(saved.read_bytes())
    # Forge the central directory's uncompressed size of the first member.
    cd = raw.rfind(b"PK\x01\x02")
    while raw.rfind(b"PK\x01\x02", 0, cd) != -1:
        cd = raw.rfind(b"PK\x01\x02", 0, cd)
    raw[cd + 24:cd + 28] = (1 << 30).to_bytes(4, "little")
    saved.write_bytes(bytes(raw))
    with pytest.raises(sm.PackageError):
        sm.load_package(saved)


def test_unsupported_version(saved):
    _manifest_edit(saved, lambda d: d.update(version=99))
    with pytest.raises(sm.PackageError, match="version 99 is not supported"):
        sm.load_package(saved)


def test_wrong_format(saved):
    _manifest_edit(saved, lambda d: d.update(format="other"))
    with pytest.raises(sm.PackageError, match="format"):
        sm.load_package(saved)


def _edit_graph(path, edit):
    """Change the IR of main and fix up its hash, as an attacker who knows the format would."""
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    doc = json.loads(members["functions/main.json"])
    edit(doc)
    members["functions/main.json"] = json.dumps(doc).encode()
    manifest = json.loads(members["manifest.json"])
    del manifest["parts"]
    parts = {k: v for k, v in members.items() if k != "manifest.json"}
    container.write(path, manifest, parts)


def test_unknown_op_is_refused_even_with_valid_hashes(saved):
    _edit_graph(saved, lambda d: d["operations"][2].update(op="os_system"))
    with pytest.raises(sm.PackageError, match="unknown op 'os_system'"):
        sm.load_package(saved)


def test_ir_that_does_not_type_check_is_refused(saved):
    def bad(doc):
        doc["operations"][-1]["outputs"][0]["shape"] = [7, 7]

    _edit_graph(saved, bad)
    with pytest.raises(sm.PackageError, match="invalid IR"):
        sm.load_package(saved)


def test_signature_disagreeing_with_graph(saved):
    _manifest_edit(saved, lambda d: d["functions"]["main"]["inputs"][0].update(shape=[-1, 5]))
    with pytest.raises(sm.PackageError, match="signature says"):
        sm.load_package(saved)


def test_bad_safetensors(tmp_path):
    pkg = _package()
    manifest, parts = pkg.manifest_and_parts()
    parts["functions/main.safetensors"] = b"\xff" * 16
    container.write(tmp_path / "s.smpkg", manifest, parts)
    with pytest.raises(sm.PackageError, match="not valid safetensors"):
        sm.load_package(tmp_path / "s.smpkg")


def test_deeply_nested_json(tmp_path):
    pkg = _package()
    manifest, parts = pkg.manifest_and_parts()
    parts["functions/main.json"] = b"[" * 100000 + b"]" * 100000
    container.write(tmp_path / "d.smpkg", manifest, parts)
    with pytest.raises(sm.PackageError, match="JSON"):
        sm.load_package(tmp_path / "d.smpkg")


def test_malformed_manifest_fields(saved):
    _manifest_edit(saved, lambda d: d["functions"]["main"]["inputs"][0].update(dtype="complex128"))
    with pytest.raises(sm.PackageError, match="inputs\\[0\\]"):
        sm.load_package(saved)


def test_directory_package_cannot_link_outside(tmp_path):
    d = tmp_path / "pkg"
    _package().save(str(d) + "/")
    secret = tmp_path / "secret.json"
    secret.write_bytes((d / "functions" / "main.json").read_bytes())
    os.remove(d / "functions" / "main.json")
    os.symlink(secret, d / "functions" / "main.json")
    with pytest.raises(sm.PackageError, match="outside the package"):
        sm.load_package(d)


def test_no_pickle_anywhere_in_a_package(saved):
    with zipfile.ZipFile(saved) as z:
        for info in z.infolist():
            head = z.read(info)[:2]
            assert head != b"\x80\x04" and head != b"\x80\x02", f"{info.filename} looks like a pickle"


def test_weights_survive_exactly(saved):
    g = sm.load_package(saved).function().graph
    (value,) = [op.attrs["value"] for op in g.operations if op.op == "constant"]
    assert torch.equal(value, torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10)


def test_package_module_never_imports_pickle_loaders():
    src = open(package_mod.__file__).read() + open(container.__file__).read()
    assert "pickle" not in src and "torch.load" not in src and "eval(" not in src


def test_mutation_fuzz_ends_in_success_or_package_error(tmp_path):
    """2,000 mutated packages and 500 mutated ONNX models (tests/fuzz_hostile.py; deterministic seeds): each
    loads or imports (then runs, or is refused running with a StitchError), or is refused with PackageError;
    none raises another exception, runs past 10 s or grows its process past 3 GB."""
    import subprocess
    import sys

    out = tmp_path / "fuzz.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    n_packages, n_onnx = int(os.environ.get("FUZZ_PACKAGES", 2000)), int(os.environ.get("FUZZ_ONNX", 500))
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz_hostile", "--packages", str(n_packages), "--onnx",
                           str(n_onnx), "--seed", os.environ.get("FUZZ_SEED", "0"), "--json", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    for kind, count in (("package", n_packages), ("onnx", n_onnx)):
        r = report["kinds"][kind]
        assert r["failures"] == [], proc.stdout[-4000:]
        assert sum(r["outcomes"].values()) == count
        assert r["outcomes"].get("loaded", 0) > count // 20  # the mutations leave many inputs valid
    refused = {k.split(": ", 1)[1] for k in report["kinds"]["package"]["outcomes"] if k.startswith("refused")}
    assert {"special file", "link", "a limit", "JSON number", "IR", "archive", "kernels", "hash"} <= refused
    refused = {k.split(": ", 1)[1] for k in report["kinds"]["onnx"]["outcomes"] if k.startswith("refused")}
    assert {"ONNX checker", "duplicates", "negative extent", "a limit", "importer"} <= refused
    assert proc.returncode == 0
