"""The package benchmark runs end to end on the CPU against ONNX Runtime and PyTorch eager.

Timings are only recorded, never asserted; what is checked is that every contender ran, that
StitchML's dispatched outputs match PyTorch, and the memory figures the benchmark reports.
"""
import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    """A benchmark script as a module, with its folder on the path as when it runs (its shared timer)."""
    folder = os.path.join(ROOT, "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_package_benchmark_on_the_cpu(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "bench.json"
    assert _load("bench_package").main(["--device", "cpu", "--models", "cnn", "transformer", "--batch", "1", "2",
                                        "--warmup", "1", "--iters", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["device"] == "cpu"
    assert [(r["model"], r["batch"]) for r in doc["results"]] == [("cnn", 1), ("cnn", 2), ("transformer", 1),
                                                                  ("transformer", 2)]
    for r in doc["results"]:
        s, o, t = r["stitchml"], r["onnxruntime"], r["torch_eager"]
        assert s["check_max_error"] <= 1e-4, r
        assert s["heap_bytes"] == s["heap_lower_bound_bytes"], r
        assert s["wall_us"] > 0 and s["encode_commit_us"] > 0 and s["encode_commit_back_to_back_us"] > 0
        assert "skipped" not in o and o["wall_us"] > 0 and o["max_error"] <= 1e-4, o
        assert t["wall_us"] > 0
        assert r["torch_compile"]["skipped"].startswith("not asked for")
    assert "cnn" in capsys.readouterr().out


@pytest.mark.slow
def test_dtype_check_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "dtypes.json"
    assert _load("check_dtypes").main(["--device", "cpu", "--quick", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {(r["dtype"], r["mode"]) for r in doc["unsigned"]} == {
        (d, m) for d in ("uint16", "uint32", "uint64") for m in ("eager", "interpret", "native")}
    assert len(doc["float8"]) == 12 and doc["timing"]["ok"] and doc["timing"]["kernels"] == 1
    assert "uint32 hash chain" in capsys.readouterr().out
