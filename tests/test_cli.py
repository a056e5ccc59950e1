"""The `stitchml` command as a user runs it: exit codes, and a mistake is one clear line, never a
traceback. A few cases run the command in a subprocess, exactly as a shell does; the many option
checks call `main` in this process (a subprocess costs seconds of importing torch each)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stitchml.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def stitchml(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stitchml.cli", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=300)


def assert_usage_error(code: int, stderr: str, *phrases: str) -> None:
    assert code == 2, (code, stderr)
    assert "Traceback" not in stderr, stderr
    for phrase in phrases:
        assert phrase in stderr, stderr


def usage_error(capsys, *args: str) -> str:
    """What `stitchml ARGS` prints on stderr when argparse rejects it (exit code 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    err = capsys.readouterr().err
    assert_usage_error(exit_.value.code, err)
    return err


@pytest.fixture(scope="module")
def relu_onnx(tmp_path_factory) -> Path:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    path = tmp_path_factory.mktemp("cli") / "relu.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


# -- in a subprocess ------------------------------------------------------------------------------
def test_zero_epochs_is_refused_before_training(tmp_path):
    run = stitchml("demo", "mnist", "--epochs", "0", cwd=tmp_path)
    assert_usage_error(run.returncode, run.stderr,
                       "stitchml demo mnist: error: argument --epochs: expected an integer above 0, got 0")
    assert "training" not in run.stdout


def test_an_absent_device_is_a_usage_error():
    name = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    run = stitchml("demo", "gelu", "--device", name)
    assert_usage_error(run.returncode, run.stderr, f"stitchml demo gelu: error: argument --device: device '{name}' "
                                                   "was asked for but this machine has", "cpu")


def test_a_stitch_error_is_one_line(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    run = stitchml("package", "build", str(junk), "-o", str(tmp_path / "j.smpkg"))
    assert_usage_error(run.returncode, run.stderr, "is not a valid ONNX model")
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("stitchml: error: "), run.stderr


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`stitchml doctor | head -1`: here the reader has gone before doctor writes anything."""
    proc = subprocess.Popen([sys.executable, "-m", "stitchml.cli", "doctor"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 1
    assert err == "", err


# -- in this process ------------------------------------------------------------------------------
@pytest.mark.parametrize("args, phrase", [
    (["--epochs=-2"], "argument --epochs: expected an integer above 0, got -2"),
    (["--epochs", "two"], "argument --epochs: expected an integer above 0, got 'two'"),
    (["--batch-size", "0"], "argument --batch-size: expected an integer above 0, got 0"),
    (["--learning-rate", "0"], "argument --learning-rate: expected a number above 0, got 0"),
    (["--learning-rate=-1e-3"], "argument --learning-rate: expected a number above 0, got -1e-3"),
    (["--learning-rate", "nan"], "argument --learning-rate: expected a number above 0, got nan"),
    (["--learning-rate", "inf"], "argument --learning-rate: expected a number above 0, got inf"),
    (["--threads", "0"], "argument --threads: expected an integer above 0, got 0"),
    (["--device", "gpu"], "argument --device: unknown device 'gpu'; expected \"cpu\", \"cuda\" or \"cuda:N\"; "
                          "this machine has: cpu"),
    (["--out", "no/such/folder/w.safetensors"], "--out 'no/such/folder/w.safetensors': the folder"),
    (["--data", "no/such/folder"], "stitchml demo mnist: error: no/such/folder: expected a folder"),
])
def test_demo_mnist_rejects_bad_options(args, phrase, capsys):
    assert phrase in usage_error(capsys, "demo", "mnist", *args)


def test_demo_gelu_options(capsys):
    assert "argument --rows: expected an integer above 0, got 0" in usage_error(capsys, "demo", "gelu", "--rows", "0")
    assert main(["demo", "gelu", "--device", "cpu", "--rows", "8", "--cols", "16", "--threads", "1", "--no-timings"]) == 0
    assert "cpu: 8x16 max |stitchml - torch gelu|" in capsys.readouterr().out


@pytest.mark.parametrize("args, phrase", [
    (["--steps", "0"], "argument --steps: expected an integer above 0, got 0"),
    (["--size=-16"], "argument --size: expected an integer above 0, got -16"),
    (["--hidden", "0"], "argument --hidden: expected an integer above 0, got 0"),
    (["--learning-rate", "nan"], "argument --learning-rate: expected a number above 0, got nan"),
])
def test_demo_neural_materials_rejects_bad_options(args, phrase, capsys):
    assert phrase in usage_error(capsys, "demo", "neural-materials", *args)


def test_unknown_demo_and_subcommand(capsys):
    assert "invalid choice: 'resnet'" in usage_error(capsys, "demo", "resnet")
    assert "invalid choice: 'train'" in usage_error(capsys, "train")
    assert main(["demo", "list"]) == 0 and "mnist" in capsys.readouterr().out


def test_package_paths_and_devices(relu_onnx, tmp_path, capsys):
    assert "the folder" in usage_error(capsys, "package", "build", str(relu_onnx), "-o",
                                       str(tmp_path / "missing" / "r.smpkg"))
    assert "absent.onnx': no such file or directory" in usage_error(
        capsys, "package", "build", str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "r.smpkg"))
    assert "argument --device: unknown device 'gpu'" in usage_error(
        capsys, "package", "build", str(relu_onnx), "-o", str(tmp_path / "r.smpkg"), "--kernels-for", "x=8,2",
        "--device", "gpu")
    assert "absent.smpkg': no such file or directory" in usage_error(
        capsys, "package", "inspect", str(tmp_path / "absent.smpkg"))
    assert not any(tmp_path.iterdir())
