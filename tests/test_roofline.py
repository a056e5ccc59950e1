"""Roofline per kernel on the CPU: bytes and FLOPs from the IR against hand counts, the device's limits
measured once and cached, and the profile's figures and order."""
from __future__ import annotations

import json

import pytest
import torch

import stitchml as sm
from stitchml.runtime import roofline

M, K, N = 16, 32, 24


def _exe():
    g = sm.Graph("roof")
    x = g.placeholder((M, K), sm.float32, name="x")
    w = g.placeholder((K, N), sm.float32, name="w")
    y = g.softmax(g.tanh(x) @ w)
    exe = g.compile({x: sm.TensorType((M, K), sm.float32), w: sm.TensorType((K, N), sm.float32)}, [y],
                    device="cpu", options={"backend": "reference"})
    return exe, {x: torch.randn(M, K), w: torch.randn(K, N)}


@pytest.fixture
def fixed(monkeypatch, tmp_path):
    """Limits of 1 GB/s and 1 GFLOP/s, counted each time they are measured; an empty cache."""
    calls = []
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(roofline, "_PEAKS", {})
    monkeypatch.setattr(roofline, "measure", lambda device: calls.append(device) or
                        {"copy_bytes_per_s": 1e9, "matmul_flops_per_s": 1e9})
    return calls


def test_bytes_and_flops_come_from_the_ir():
    exe, _ = _exe()
    ops = {op.name: op for op in exe.program.operations if op.op == "fusion"}
    costs = {op.attrs["template"]: roofline.cost(op) for op in ops.values()}
    # tanh: reads x, writes tanh(x); one op per element
    assert costs["pointwise"] == (2 * M * K * 4, M * K)
    # the product reads both operands and writes M x N; 2 M N K
    assert costs["matmul"] == ((M * K + K * N + M * N) * 4, 2 * M * N * K)
    # softmax over rows: reads and writes M x N; maximum, subtraction, exponent, sum, division per element
    assert costs["reduction"] == (2 * M * N * 4, 5 * M * N)


def test_limits_are_measured_once_per_device_and_cached_on_disk(fixed, tmp_path):
    cpu = torch.device("cpu")
    assert roofline.peaks(cpu)["copy_bytes_per_s"] == 1e9 and len(fixed) == 1
    roofline.peaks(cpu)
    assert len(fixed) == 1
    roofline._PEAKS.clear()  # a new process: read back from the disk
    assert roofline.peaks(cpu)["matmul_flops_per_s"] == 1e9 and len(fixed) == 1
    stored = json.loads((tmp_path / "roofline.json").read_text())
    assert list(stored) == [roofline.device_key(cpu)]


def test_profile_reports_fractions_of_the_limits_sorted_by_time_left(fixed):
    exe, feeds = _exe()
    report = exe.profile(feeds, repeats=3)
    assert len(fixed) == 1 and sorted(r["step"] for r in report.rows) == sorted(s.name for s in exe.steps)
    for r in report.rows:
        seconds = r["ms"] / 1e3
        assert r["ms"] > 0 and r["bytes"] > 0
        assert r["bandwidth_fraction"] == pytest.approx(r["bytes"] / seconds / 1e9)
        assert r["flops_fraction"] == pytest.approx(r["flops"] / seconds / 1e9)
        assert r["ideal_ms"] == pytest.approx(1e3 * max(r["bytes"], r["flops"]) / 1e9)
        assert r["left_ms"] == pytest.approx(max(r["ms"] - r["ideal_ms"], 0.0))
    lefts = [r["left_ms"] for r in report.rows]
    assert lefts == sorted(lefts, reverse=True)
    text = str(report)
    assert text.startswith("roofline on cpu:") and "1.0 GB/s" in text and all(r["step"] in text for r in report.rows)


def test_the_cpu_measurement_is_plausible():
    measured = roofline.measure(torch.device("cpu"))
    assert 1e8 < measured["copy_bytes_per_s"] < 1e13  # between 100 MB/s and 10 TB/s
    assert 1e8 < measured["matmul_flops_per_s"] < 1e14
