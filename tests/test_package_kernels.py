"""Kernel bundles: the format, what installing writes, hostile bundles, and what a pipeline does with them.

Triton cannot compile on the CPU, so the Triton entries here are written by Triton's own cache manager
with made-up contents: the layout, names and group files are exactly Triton's.
"""
import hashlib
import importlib
import json
import os

import numpy as np
import pytest

import stitchml as sm
from stitchml.cli import main
from stitchml.runtime import choices, loader
from stitchml.errors import PackageError
from stitchml.package import Package, container, current_target
from stitchml.package import kernels as K

SOURCE = b"import triton\n\n@triton.jit\ndef kernel0(x):\n    pass\n"
SOURCE_NAME = f"k{hashlib.sha256(SOURCE).hexdigest()[:32]}.py"
TARGET = {"arch": "sm_90", "triton": "3.6.0", "triton_build": "0123456789abcdef"}


def _triton_entry(cache: str, key: bytes, kernel: str = "kernel0") -> str:
    """Write one compiled kernel as Triton does (its cache manager, its group file); the entry's name."""
    from triton.runtime.cache import get_cache_manager

    with K.triton_cache_at(cache):
        m = get_cache_manager(hashlib.sha256(key).hexdigest())
        paths = {f"{kernel}.{ext}": m.put(data, f"{kernel}.{ext}")
                 for ext, data in (("cubin", b"\x7fELF-cubin"), ("ptx", b"// ptx"), ("ttir", b"module {}"))}
        paths[f"{kernel}.json"] = m.put(json.dumps({"name": kernel, "num_warps": 4}), f"{kernel}.json")
        m.put_group(f"{kernel}.json", paths)
        return os.path.basename(m.cache_dir)


@pytest.fixture
def built(tmp_path):
    """A Triton cache with two compiled kernels and a launcher library, and the bundle made of it."""
    cache = tmp_path / "built"
    entries = [_triton_entry(str(cache), b"a"), _triton_entry(str(cache), b"b", "kernel1")]
    launcher = cache / ("C" * 52)
    launcher.mkdir()
    (launcher / "__triton_launcher.so").write_bytes(b"\x7fELF-host-code")
    bundle = K.Bundle(dict(TARGET), {"torch": "2.11.0"}, {SOURCE_NAME: SOURCE}, K.collect(str(cache)))
    return bundle, entries


def _raw(header: dict, files: list[bytes]) -> bytes:
    body = json.dumps(header).encode()
    return K.MAGIC + len(body).to_bytes(8, "little") + body + b"".join(files)


def _header(files):
    return {"format": K.FORMAT, "version": K.VERSION, "target": dict(TARGET), "built_with": {},
            "files": [{"path": p, "size": len(d)} for p, d in files]}


# -- the format -----------------------------------------------------------------------------------
def test_collect_takes_tritons_kernel_entries_and_leaves_host_libraries_out(built):
    bundle, entries = built
    assert sorted(bundle.entries) == sorted(entries)
    first = bundle.entries[entries[0]]
    assert sorted(first) == ["__grp__kernel0.json", "kernel0.cubin", "kernel0.json", "kernel0.ptx", "kernel0.ttir"]
    assert first["kernel0.cubin"] == b"\x7fELF-cubin"
    # Triton's group holds absolute paths of the machine that compiled; the bundle's hold names
    assert json.loads(first["__grp__kernel0.json"]) == {"child_paths": {n: n for n in sorted(first) if n[0] != "_"}}
    assert bundle.kernel_count == 2


def test_round_trip(built):
    bundle, _ = built
    back = K.unpack(K.pack(bundle))
    assert back == bundle
    assert K.pack(back) == K.pack(bundle)


def test_install_writes_what_triton_reads_back_in_another_cache(built, tmp_path):
    from triton.runtime.cache import get_cache_manager

    bundle, entries = built
    cache, sources = tmp_path / "triton", tmp_path / "stitchml" / "kernels"
    done = K.install(K.unpack(K.pack(bundle)), str(sources), str(cache))
    assert (sources / SOURCE_NAME).read_bytes() == SOURCE
    assert sorted(os.listdir(cache)) == sorted(entries)  # no launcher library
    with K.triton_cache_at(str(cache)):
        group = get_cache_manager(hashlib.sha256(b"a").hexdigest()).get_group("kernel0.json")
    assert group is not None, "Triton does not find the installed kernel"
    assert {os.path.dirname(p) for p in group.values()} == {str(cache / entries[0])}
    assert open(group["kernel0.cubin"], "rb").read() == b"\x7fELF-cubin"
    expected = {str(sources / SOURCE_NAME)} | {str(cache / e / n) for e, fs in bundle.entries.items() for n in fs}
    assert set(done.written) == expected and done.present == []
    again = K.install(bundle, str(sources), str(cache))
    assert again.written == [] and set(again.present) == expected


def test_install_never_overwrites(built, tmp_path):
    bundle, entries = built
    cache, sources = tmp_path / "triton", tmp_path / "kernels"
    (cache / entries[0]).mkdir(parents=True)
    (cache / entries[0] / "kernel0.cubin").write_bytes(b"already here")
    sources.mkdir()
    (sources / SOURCE_NAME).write_bytes(b"already here too")
    done = K.install(bundle, str(sources), str(cache))
    assert (cache / entries[0] / "kernel0.cubin").read_bytes() == b"already here"
    assert (sources / SOURCE_NAME).read_bytes() == b"already here too"
    assert set(done.present) == {str(cache / entries[0] / "kernel0.cubin"), str(sources / SOURCE_NAME)}
    assert (cache / entries[0] / "kernel0.ptx").read_bytes() == b"// ptx"
    assert not [n for e in entries for n in os.listdir(cache / e) if n.startswith(".install-")]


def test_triton_cache_at_comes_back(tmp_path):
    from triton import knobs

    before, env = knobs.cache.dir, os.environ.get("TRITON_CACHE_DIR")
    with K.triton_cache_at(str(tmp_path)):
        assert knobs.cache.dir == str(tmp_path) and K.triton_cache_dir() == str(tmp_path)
    assert knobs.cache.dir == before and os.environ.get("TRITON_CACHE_DIR") == env


def test_loader_names_files_as_bundles_do(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    src = "import triton\n\n@triton.jit\ndef named_kernel(x):\n    pass\n"
    fn = loader.load("named_kernel", src)
    assert os.path.exists(os.path.join(loader.cache_dir(), loader.file_name(src)))
    assert loader.file_name(src) == f"k{hashlib.sha256(src.encode()).hexdigest()[:32]}.py"
    assert loader.load("named_kernel", src) is fn
    loader.forget()
    assert loader.load("named_kernel", src) is not fn  # a fresh JIT function: Triton compiles it again


def test_a_chooser_told_to_remeasure_runs_every_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(choices, "_decisions", {"k": "slow"})
    ran, times = [], {"fast": 1.0, "slow": 2.0}

    def timed(fn, env):
        fn(env)
        return times[ran[-1]]

    monkeypatch.setattr(choices, "_time", timed)
    monkeypatch.setattr(choices.torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here
    candidates = {name: (lambda n: lambda env: ran.append(n))(name) for name in times}
    choices.Chooser("k", candidates)([])
    assert ran == ["slow"]  # the stored decision: nothing measured
    ran.clear()
    again = choices.Chooser("k", candidates)
    again.remeasure = True
    again([])
    assert set(ran) == {"fast", "slow"} and again.chosen == "fast"


# -- hostile and damaged bundles ---------------------------------------------------------------------
E = "A" * 52
META = b'{"name": "kernel0"}'


def _group(children: dict) -> bytes:
    return json.dumps({"child_paths": children}).encode()


GROUP = _group({"kernel0.cubin": "kernel0.cubin", "kernel0.json": "kernel0.json"})


def _files(**change):
    """The files of a small valid bundle; change={path: bytes or None} replaces or drops one."""
    files = {f"sources/{SOURCE_NAME}": SOURCE, f"triton/{E}/kernel0.cubin": b"\x7fELF",
             f"triton/{E}/kernel0.json": META, f"triton/{E}/__grp__kernel0.json": GROUP}
    for path, data in change.items():
        path = path.replace("GRP", f"triton/{E}/__grp__kernel0.json").replace("META", f"triton/{E}/kernel0.json")
        if data is None:
            files.pop(path)
        else:
            files[path] = data
    return list(files.items())


def _blob(files, **header):
    return _raw({**_header(files), **header}, [d for _, d in files])


VALID = _blob(_files())
OTHER = "k" + "0" * 32 + ".py"
NOT_TEXT = f"k{hashlib.sha256(bytes([0xff])).hexdigest()[:32]}.py"

HOSTILE = {
    "empty": (b"", "not a kernel bundle"),
    "another format": (b"PK\x03\x04" + VALID[4:], "not a kernel bundle"),
    "header over the limit": (K.MAGIC + (K.MAX_HEADER_BYTES + 1).to_bytes(8, "little"), "over the limit"),
    "truncated header": (VALID[:40], "truncated: the header needs"),
    "truncated files": (VALID[:-3], "truncated: triton/" + E + "/__grp__kernel0.json needs"),
    "trailing bytes": (VALID + b"x", "1 bytes follow the last file"),
    "header not JSON": (K.MAGIC + (5).to_bytes(8, "little") + b"{nope", "not valid UTF-8 JSON"),
    "newer version": (_blob(_files(), version=2), "expected 'stitchml.kernels' version 1"),
    "target without triton": (_blob(_files(), target={"arch": "sm_90"}), "target must map strings to strings"),
    "size over the limit": (_raw({**_header(_files()), "files": [{"path": f"sources/{SOURCE_NAME}",
                                                                   "size": K.MAX_FILE_BYTES + 1}]}, []),
                            "expected {'path': str of at most 256, 'size': 0.."),
    "size not a number": (_raw({**_header(_files()), "files": [{"path": f"sources/{SOURCE_NAME}", "size": True}]}, []),
                          "expected {'path': str of at most 256, 'size': 0.."),
    "too many files": (_raw({**_header([]), "files": [{"path": f"sources/{OTHER}", "size": 0}] * (K.MAX_FILES + 1)},
                            []), f"at most {K.MAX_FILES}"),
    "a path twice": (_blob(_files() + _files()[:1]), "appears twice"),
    "traversal": (_blob(_files(**{"sources/../../etc/cron.d/x": b"x"})), "must be sources/k<32 hex>.py or triton"),
    "traversal through an entry": (_blob(_files(**{"triton/../kernel0.cubin": b"x"})), "must be a SHA-256"),
    "absolute path": (_blob(_files(**{"/etc/passwd": b"x"})), "must be sources/k<32 hex>.py or triton"),
    "a level too deep": (_blob(_files(**{f"triton/{E}/sub/kernel0.cubin": b"x"})), "must be sources/k<32 hex>"),
    "source name": (_blob(_files(**{"sources/evil.py": b"x"})), "source name 'evil.py' must be k<32 hex>.py"),
    "source hash": (_blob(_files(**{f"sources/{OTHER}": SOURCE})), "content's SHA-256 starts"),
    "source not text": (_blob(_files(**{f"sources/{NOT_TEXT}": bytes([0xff])})), "not UTF-8 text"),
    "host library": (_blob(_files(**{f"triton/{E}/__triton_launcher.so": b"\x7fELF"})), "must be <kernel>.<source"),
    "hidden file": (_blob(_files(**{f"triton/{E}/.kernel0.json": b"{}"})), "must be <kernel>.<source"),
    "group of another kind": (_blob(_files(**{f"triton/{E}/__grp__kernel0.cubin": b"{}"})), "__grp__<kernel>.json"),
    "group not JSON": (_blob(_files(GRP=b"not json")), "not valid UTF-8 JSON"),
    "group with paths": (_blob(_files(GRP=_group({"kernel0.cubin": "/home/x/kernel0.cubin",
                                                  "kernel0.json": "kernel0.json"}))), "expected {\"child_paths\""),
    "group lists a missing file": (_blob(_files(GRP=_group({n: n for n in ("kernel0.json", "kernel0.ptx")}))),
                                   "lists 'kernel0.ptx', which is not a kernel file"),
    "group without metadata": (_blob(_files(GRP=_group({"kernel0.cubin": "kernel0.cubin"}))),
                               "does not list the kernel's metadata kernel0.json"),
    "metadata not an object": (_blob(_files(META=b"[1]")), "metadata must be a JSON object"),
    "stray file": (_blob(_files(**{f"triton/{E}/kernel9.cubin": b"x"})), "['kernel9.cubin'] belong to no group"),
    "entry without group": (_blob(_files(GRP=None)), "no __grp__<kernel>.json lists"),
    "variants of another kind": (_blob(_files(), variants={SOURCE_NAME: [["16", "$(rm -rf ~)"]]}),
                                 "variants must map source names to lists of binaries"),
    "variants of a missing source": (_blob(_files(), variants={OTHER: [["16"]]}), "sources the bundle does not carry"),
}


def test_the_valid_bundle_the_hostile_ones_derive_from_is_accepted():
    bundle = K.unpack(VALID)
    assert bundle.sources == {SOURCE_NAME: SOURCE} and bundle.kernel_count == 1


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundle_is_refused(case, tmp_path):
    blob, message = HOSTILE[case]
    with pytest.raises(PackageError) as e:
        K.unpack(blob, "bundle under test")
    assert str(e.value).startswith("bundle under test") and message in str(e.value), str(e.value)


# -- in a package ------------------------------------------------------------------------------------
def _fn():
    g = sm.Graph()
    x = g.placeholder((-1, 4), sm.float32, name="x")
    return Package.from_graph(g, {"x": x}, {"y": g.tanh(x) * 2.0}).function()


def test_add_kernels_takes_only_bundles_for_the_target_it_is_told():
    pkg = _fn().package
    with pytest.raises(PackageError, match=r"add_kernels\('main'\): not a kernel bundle"):
        pkg.add_kernels("main", {"x": (2, 4)}, TARGET, b"cache")
    other = {**TARGET, "arch": "sm_80"}
    with pytest.raises(PackageError, match=r"built for sm_90/triton 3.6.0 \(build 0123456789abcdef\), the entry says sm_80"):
        pkg.add_kernels("main", {"x": (2, 4)}, other, K.pack(K.Bundle(dict(TARGET), {}, {}, {})))
    assert pkg.kernels == []


def test_add_kernels_replaces_the_bundle_for_the_same_dimensions_and_target():
    pkg = _fn().package
    first = pkg.add_kernels("main", {"x": (2, 4)}, TARGET, VALID)
    empty = K.pack(K.Bundle(dict(TARGET), {}, {}, {}))
    again = pkg.add_kernels("main", {"x": (2, 4)}, TARGET, empty)
    assert pkg.kernels == [again] and again.part == first.part
    assert pkg.find_kernels("main", {"x": (2, 4)}, TARGET)[0] == empty
    other = pkg.add_kernels("main", {"x": (3, 4)}, TARGET, VALID)
    assert len(pkg.kernels) == 2 and other.part != first.part


def test_a_build_that_differs_only_in_triton_build_does_not_match():
    pkg = _fn().package
    pkg.add_kernels("main", {"x": (2, 4)}, TARGET, VALID)
    blob, why = pkg.find_kernels("main", {"x": (2, 4)}, {**TARGET, "triton_build": "fedcba9876543210"})
    assert blob is None
    assert why == ("the package's kernels target sm_90/triton 3.6.0 (build 0123456789abcdef), "
                   "this machine is sm_90/triton 3.6.0 (build fedcba9876543210)")


@pytest.mark.parametrize("damage, message", [
    (lambda blob, manifest: (blob[:-3], manifest), "manifest kernels[0] part kernels/main-0.bin: truncated"),
    (lambda blob, manifest: (blob, {**manifest, "kernels": [{**manifest["kernels"][0], "target": {"arch": "sm_80",
                                                                                                 "triton": "3.6.0"}}]}),
     "the bundle was built for sm_90/triton 3.6.0 (build 0123456789abcdef), the entry says sm_80/triton 3.6.0"),
])
def test_load_package_refuses_a_damaged_or_mislabelled_bundle(tmp_path, damage, message):
    pkg = _fn().package
    pkg.add_kernels("main", {"x": (2, 4)}, TARGET, VALID)
    manifest, parts = pkg.manifest_and_parts()
    parts["kernels/main-0.bin"], manifest = damage(parts["kernels/main-0.bin"], manifest)
    container.write(tmp_path / "bad.smpkg", manifest, parts)
    with pytest.raises(PackageError) as e:
        sm.load_package(tmp_path / "bad.smpkg")
    assert message in str(e.value)


# -- what a pipeline does with them ------------------------------------------------------------------
@pytest.fixture
def carried(tmp_path, monkeypatch):
    """A saved package whose bundle for this machine holds its real kernel sources and one Triton entry."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # generated kernels (Triton's interpreter runs them)
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path / "build"))
    fn = _fn()
    exe = fn.graph.compile({fn.input_tensor("x"): sm.TensorType((2, 4), sm.float32)}, [fn.output_tensor("y")],
                           device="cpu")
    sources = {loader.file_name(s): s.encode() for s in exe.kernel_sources().values()}
    entry = _triton_entry(str(tmp_path / "built"), b"a")
    here = current_target("cpu")
    fn.package.add_kernels("main", {"x": (2, 4)}, here,
                           K.pack(K.Bundle(here, {}, sources, K.collect(str(tmp_path / "built")))))
    fn.package.save(tmp_path / "p.smpkg")
    # the loading side: empty caches, kernels imported anew
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path / "load"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    loader.forget()
    return sm.load_package(tmp_path / "p.smpkg").function(), sources, entry


def _pipeline(fn, use=True):
    desc = sm.MLPipelineDescriptor(fn)
    desc.set_input_dimensions("x", (2, 4))
    desc.use_package_kernels = use
    return sm.Compiler(sm.device("cpu")).new_ml_pipeline(desc)


def test_pipeline_installs_the_bundle_then_compiles_from_it(carried, tmp_path):
    fn, sources, entry = carried
    assert sources, "the function has generated kernels"
    written = loader.stats["written"]
    pipe = _pipeline(fn)
    assert pipe.kernel_note == f"using the package's compiled kernels (1 kernels, built for cpu/triton " \
                               f"{current_target('cpu')['triton']})"
    assert sorted(os.listdir(tmp_path / "load" / "kernels")) == sorted(sources)
    assert os.listdir(tmp_path / "triton") == [entry]
    assert sorted(os.listdir(tmp_path / "triton" / entry)) == sorted(os.listdir(tmp_path / "built" / entry))
    assert loader.stats["written"] == written, "the compile wrote a kernel source the bundle carries"
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    y = pipe.executable.run({fn.input_tensor("x"): x})[fn.output_tensor("y")]
    np.testing.assert_allclose(y.numpy(), np.tanh(x) * 2, rtol=1e-6)


def test_a_bundle_serves_another_batch_size_without_a_new_kernel(carried, tmp_path):
    """The bundle was built for x: (2, 4); a pipeline for (8, 4) generates exactly the bundle's sources (the
    kernels take their sizes as arguments; 8 and 32 elements launch the same block), so Triton finds every
    binary the bundle carries and compiles nothing."""
    fn, sources, entry = carried
    written = loader.stats["written"]
    desc = sm.MLPipelineDescriptor(fn)
    desc.set_input_dimensions("x", (8, 4))
    pipe = sm.Compiler(sm.device("cpu")).new_ml_pipeline(desc)
    assert pipe.kernel_note.startswith("using the package's compiled kernels (1 kernels, built for cpu/triton") and \
        pipe.kernel_note.endswith("at x=[2, 4], serving other sizes)"), pipe.kernel_note
    assert {loader.file_name(s) for s in pipe.executable.kernel_sources().values()} == set(sources)
    assert loader.stats["written"] == written, "the compile generated a kernel source the bundle does not carry"
    assert os.listdir(tmp_path / "triton") == [entry]
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(8, 4)
    y = pipe.executable.run({fn.input_tensor("x"): x})[fn.output_tensor("y")]
    np.testing.assert_allclose(y.numpy(), np.tanh(x) * 2, rtol=1e-6)


def test_kernels_are_the_same_for_sizes_with_the_same_launch_blocks(monkeypatch):
    """Sizes are kernel arguments: 9 and 16 rows (36 and 64 elements) give the same sources and the same
    constexprs, so Triton compiles each kernel once; 40 rows (160 elements) the same sources with other
    blocks."""
    from stitchml.runtime.launch import KernelLaunch
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = sm.Graph()
    x = g.placeholder((-1, 4), sm.float32, name="x")
    y = [g.tanh(x) * 2.0, g.softmax(g.exponent(x))]

    def kernels(rows):
        exe = g.compile({x: sm.TensorType((rows, 4), sm.float32)}, y, device="cpu")
        out = exe.run({x: np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)})
        np.testing.assert_allclose(out[y[0]].numpy(), np.tanh(np.linspace(-1, 1, rows * 4)).reshape(rows, 4) * 2,
                                   rtol=1e-6)
        steps = [s for s in exe.steps if isinstance(s.run, KernelLaunch)]
        assert len(steps) == 2
        return [(loader.file_name(s.source), s.run.meta) for s in steps]

    nine, sixteen, forty = kernels(9), kernels(16), kernels(40)
    assert nine == sixteen
    assert [name for name, _ in forty] == [name for name, _ in nine] and forty != nine


def test_pipeline_told_not_to_use_the_bundle_installs_nothing(carried, tmp_path):
    fn, _, _ = carried
    assert _pipeline(fn, use=False).kernel_note == "compiled here: the descriptor's use_package_kernels is off"
    assert not (tmp_path / "triton").exists()


def test_a_bundle_that_cannot_be_installed_leaves_the_pipeline_compiling(carried, tmp_path, monkeypatch):
    fn, _, _ = carried
    (tmp_path / "a-file").write_bytes(b"")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    note = _pipeline(fn).kernel_note
    assert note.startswith("compiled here: the package's kernels (built for cpu/triton") and \
        "could not be installed" in note


def test_compile_kernels_needs_a_gpu():
    with pytest.raises(PackageError, match=r"compile_kernels\('main'\): kernels are compiled on a CUDA device; "
                                           r"got 'cpu'"):
        _fn().package.compile_kernels("main", {"x": (2, 4)}, device="cpu")


def test_cli_kernels_for(tmp_path, capsys):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    model = tmp_path / "relu.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    out = tmp_path / "relu.smpkg"
    with pytest.raises(SystemExit) as exit_:
        main(["package", "build", str(model), "-o", str(out), "--kernels-for", "x=8,a"])
    assert exit_.value.code == 2
    assert "--kernels-for 'x=8,a': expected NAME=D0,D1,... with integer extents" in capsys.readouterr().err
    assert main(["package", "build", str(model), "-o", str(out), "--kernels-for", "x=8,2", "--device", "cpu"]) == 2
    assert "kernels are compiled on a CUDA device" in capsys.readouterr().err
    assert not out.exists()


def test_a_bundle_carries_both_size_specialisations_so_another_batch_compiles_nothing(monkeypatch):
    """Triton specialises a kernel's size arguments on divisibility by 16 (vector loads and stores): a bundle
    built at 12 rows (48 elements, 12 rows to reduce) records, and `build` compiles, each kernel for both
    classes and for the blocks of an eighth to eight times its sizes, so 9 rows (36 elements), 16 rows
    (64 elements) and 40 rows (160 elements, other blocks) find every binary; a bundle of the launched
    binaries alone would not."""
    from stitchml.runtime.launch import specialisation
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = sm.Graph()
    x = g.placeholder((-1, 4), sm.float32, name="x")
    y = [g.tanh(x) * 2.0, g.softmax(g.exponent(x))]

    def compiled(rows):
        return g.compile({x: sm.TensorType((rows, 4), sm.float32)}, y, device="cpu")

    built, nine, sixteen, forty = compiled(12), compiled(9), compiled(16), compiled(40)
    variants = K.variants_of(built)
    sources = {loader.file_name(s): s.encode() for s in built.kernel_sources().values()}
    assert sorted(variants) == sorted(sources)
    pointwise, rows = (next(s.run for s in built.steps if s.kind == kind) for kind in ("pointwise", "reduction"))
    assert (pointwise.sizes, rows.sizes) == ((48,), (12,))
    # its own block (48 elements: 64) and those of 6 to 384 elements (32, 128, 256, 512), each for both classes
    assert variants[pointwise.file] == sorted([c, f"BLOCK={b}", f"num_warps={w}"] for c in ("16", "any")
                                              for b, w in ((32, 1), (64, 1), (128, 1), (256, 4), (512, 4)))
    assert sorted({v[0] for v in variants[rows.file]}) == ["16", "any"]
    bundle = K.unpack(K.pack(K.Bundle(dict(TARGET), {}, sources, {}, variants)))
    assert bundle.variants == variants
    for exe in (nine, sixteen):
        assert K.unserved(bundle, exe) == []
    assert [specialisation(s.run.sizes) for s in nine.steps] == [("any",), ("any",)]
    assert [specialisation(s.run.sizes) for s in sixteen.steps] == [("16",), ("16",)]
    alone = K.Bundle(dict(TARGET), {}, sources, {}, {s.run.file: [s.run.binary()] for s in built.steps})
    assert K.unserved(alone, nine) == [f"{pointwise.file} (any, BLOCK=64, num_warps=1)"]
    assert K.unserved(alone, sixteen) == [f"{rows.file} (16, BLOCK_R=16, BLOCK_C=16, num_warps=4)"]
    # 160 elements and 40 rows launch other blocks than 48 and 12 do, which the bundle compiled as well;
    # 160 rows (640 elements: blocks 1024 and 256 rows) are more than eight times 12, beyond what it compiles
    assert K.unserved(bundle, forty) == []
    assert K.unserved(alone, forty) == [f"{pointwise.file} (16, BLOCK=256, num_warps=4)",
                                        f"{rows.file} (any, BLOCK_R=64, BLOCK_C=16, num_warps=4)"]
    assert K.unserved(bundle, compiled(160)) == [f"{pointwise.file} (16, BLOCK=1024, num_warps=4)",
                                                 f"{rows.file} (16, BLOCK_R=256, BLOCK_C=16, num_warps=4)"]
    assert K.unserved(K.Bundle(dict(TARGET), {}, sources, {}), nine) is None  # a bundle that does not say


def test_a_step_of_several_kernels_lists_each_kernel_file(monkeypatch):
    """A matmul whose operand a producer kernel computes, run as separate steps (the producer's kernel, the
    vendor GEMM, the epilogue kernel): a bundle lists and ships each kernel's own source file, not the
    step's joined text."""
    from stitchml.runtime.launch import launches
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = sm.Graph()
    x, w = g.placeholder((8, 4), sm.float32, name="x"), g.placeholder((4, 6), sm.float32, name="w")
    exe = g.compile({x: sm.TensorType((8, 4), sm.float32), w: sm.TensorType((4, 6), sm.float32)},
                    [g.relu(g.tanh(x) @ w + 1.0)], device="cpu", options={"prologue": "separate"})
    (step,) = [s for s in exe.steps if s.kind == "matmul"]
    kernels = list(launches(step.run))
    assert len(kernels) == 2 and all(loader.file_name(k.source) == k.file for k in kernels)
    assert sorted(K.variants_of(exe)) == sorted(k.file for k in kernels)
