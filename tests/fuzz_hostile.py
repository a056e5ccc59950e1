"""Mutation fuzzing of the package loader and the ONNX importer: every input ends in success or PackageError.

    python -m tests.fuzz_hostile --packages 50000 --onnx 50000          # a long run: counts per outcome
    python -m tests.fuzz_hostile --only onnx:1234 --seed 0              # one input again, with its traceback

Input `i` of a kind is generated from ``random.Random(f"{seed}/{kind}/{i}")`` alone, so any input can be
made again from its kind, index and seed. Packages are valid ones (a matrix product, a convolution with a
reduction, an imported ONNX CNN) with one hostile change: any JSON field replaced by a hostile value, raw
JSON text (a 4,301-digit integer, 1e999, Infinity), damaged bytes or archives, wrong sizes and hashes,
parts replaced by FIFOs, links that loop or leave, sparse parts over the size limit, forged kernel bundles.
ONNX models are small valid ones with one change to an attribute (axis -100, stride 0, huge ints, a tensor
or a string where an int belongs), an initializer (zero divisors, indices out of range, 2^40 limits,
negative or huge dims), a declared shape, the graph's structure (duplicate outputs or initializers,
dropped or repeated nodes, other op types and opsets), or the serialized bytes. What loads is run once.

Inputs run in a worker process that a supervisor watches: an input running past ``--time-limit`` or
a worker growing past ``--max-rss-mb`` is killed and counted as a hang or as memory, and the worker
restarts after it. The summary prints counts per outcome class and every failure with its reproducer.
Outcomes: ``loaded`` (and ran, or was refused running with a StitchError), ``refused: <reason>``
(PackageError), and the failures ``untyped: <exception>``, ``hang``, ``memory``, ``crash``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter

FAILURES = ("untyped", "hang", "memory", "crash")

# Limits for fuzzing: small enough that anything accepted also runs cheaply.
FUZZ_LIMITS = dict(max_part_bytes=1 << 24, max_package_bytes=1 << 26, max_tensor_elements=1 << 20,
                   max_operations=20_000, max_model_bytes=1 << 24, max_nodes=2_000, max_folded_elements=1 << 20,
                   max_unrolled_steps=256)


# -- the inputs ------------------------------------------------------------------------------------------
def _base_packages():
    import numpy as np

    import stitchml as sm
    from stitchml.ops import Convolution2DDescriptor
    from stitchml.package import Package

    out = []
    g = sm.Graph()
    x = g.placeholder((-1, 3), sm.float32, name="x")
    w = g.constant(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    out.append(Package.from_graph(g, {"x": x}, {"y": g.tanh(x @ w)}, dim_names={"x": ["batch", None]}))
    g = sm.Graph()
    x = g.placeholder((-1, 1, 6, 6), sm.float32, name="x")
    w = g.constant(np.ones((2, 1, 3, 3), np.float32))
    y = g.convolution2d(x, w, Convolution2DDescriptor(stride=(2, 1), padding=(1, 1, 0, 0)))
    out.append(Package.from_graph(g, {"x": x}, {"y": g.reduction_sum(g.relu(y), (2, 3), True)}))
    out.append(sm.package.from_onnx(_onnx_models()["cnn"]))
    return [p.manifest_and_parts() for p in out]


_HOSTILE_JSON = [None, -1, 0, 1, 2 ** 31, 2 ** 40, 2 ** 62, -(2 ** 63), 1.5, 1e308, True, False, "x", "../x", "",
                 [], {}, [0], [1, 2], [[1]], [-1, 3], [0, 0], [2 ** 40, 2 ** 40], {"a": 1},
                 {"$tensor": "nope"}, {"$dtype": "complex64"}, {"$dtype": "float32"}, {"$float": "nan"},
                 {"$float": "inf"}, {"$float": "-inf"}, {"$float": "x"}, {"$dict": {"a": 1}}, {"$dict": 3},
                 "float32", "NCHW", {"$unknown": 1}]
_HOSTILE_TOKENS = ["9" * 4301, "-" + "9" * 30, "1e999", "-1e999", "Infinity", "NaN", "-0", "1.5", "true", "null",
                   "[]", "{}", '"x"', "18446744073709551616", "9223372036854775807", "-9223372036854775808",
                   "0", "-1", "2"]


def _locations(doc):
    stack = [doc]
    while stack:
        v = stack.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, child in items:
            yield v, k
            stack.append(child)


def _tensor_keys(parts) -> list[str]:
    keys = []
    for name, data in parts.items():
        if name.endswith(".safetensors"):
            n = int.from_bytes(data[:8], "little")
            keys += [k for k in json.loads(data[8:8 + n]) if k != "__metadata__"]
    return keys


def _mutate_package(rng: random.Random, bases, root: str) -> tuple[str, str]:
    """Write one mutated package under root; returns (path, the mutation's description)."""
    from stitchml.package import container, kernels

    manifest, parts = copy.deepcopy(rng.choice(bases))
    manifest = copy.deepcopy(manifest)
    parts = dict(parts)
    graph_part = next(n for n in parts if n.endswith(".json"))
    directory = rng.random() < 0.35
    path = os.path.join(root, "m.smpkg") + (os.sep if directory else "")
    kind = rng.choice(["json", "json", "json", "text", "text", "bytes", "archive", "files", "table", "kernels"])
    if kind == "files" and not directory:
        path, directory = path + os.sep, True
    if kind == "archive" and directory:
        path, directory = path.rstrip(os.sep), False
    desc = kind
    if kind == "json":
        target = rng.choice(["manifest", "graph", "graph"])
        doc = manifest if target == "manifest" else json.loads(parts[graph_part])
        holder, key = rng.choice(list(_locations(doc)))
        value = rng.choice(_HOSTILE_JSON + [{"$tensor": k} for k in _tensor_keys(parts)])
        holder[key] = copy.deepcopy(value)
        desc = f"json {target}[{key!r}] = {str(value)[:40]}"
        if target == "graph":
            parts[graph_part] = json.dumps(doc).encode()
    elif kind == "text":
        text = parts[graph_part].decode()
        spans = [(i, j) for i, j in _number_spans(text)]
        i, j = rng.choice(spans)
        token = rng.choice(_HOSTILE_TOKENS)
        parts[graph_part] = (text[:i] + token + text[j:]).encode()
        desc = f"text {text[max(i - 20, 0):i]!r} <- {token[:20]}"
    elif kind == "bytes":
        name = rng.choice(sorted(parts))
        data = bytearray(parts[name])
        for _ in range(rng.randint(1, 4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data) + 1)]
        parts[name] = bytes(data)
        desc = f"bytes of {name} (hashes made valid)"
    elif kind == "kernels":
        fn = next(iter(manifest["functions"]))
        target = {"arch": "sm_90", "triton": "3.6.0"}
        files = {"sources/k" + "0" * 32 + ".py": b"x = 1\n"}
        blob = bytearray(kernels.pack(kernels.Bundle(target, {"by": "fuzz"}, {}, {})))
        if rng.random() < 0.7:
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        else:
            header = json.dumps({"format": "stitchml.kernels", "version": 1, "target": target,
                                 "files": [{"path": p, "size": rng.choice([len(d), 0, 2 ** 40, -1])}
                                           for p, d in files.items()]}).encode()
            blob = bytearray(b"SMKERNEL" + len(header).to_bytes(8, "little") + header + b"".join(files.values()))
        parts["kernels/main-0.bin"] = bytes(blob)
        manifest["kernels"] = [{"function": fn, "input_dimensions": {"x": [2, 3]}, "target": target,
                                "part": "kernels/main-0.bin", "compiler": "fuzz"}]
        desc = "kernel bundle"
    container.write(path, manifest, parts)
    if kind == "archive":
        data = bytearray(open(path, "rb").read())
        choice = rng.choice(["truncate", "flip", "flip_tail", "append"])
        if choice == "truncate":
            data = data[:rng.randrange(len(data))]
        elif choice == "flip":
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice == "flip_tail":  # the central directory: sizes, offsets, methods
            for _ in range(rng.randint(1, 4)):
                data[len(data) - 1 - rng.randrange(min(len(data), 200))] = rng.randrange(256)
        else:
            data += os.urandom(rng.randint(1, 64))
        open(path, "wb").write(bytes(data))
        desc = f"archive {choice}"
    elif kind == "table":
        _edit_table(rng, path, directory)
        desc = "parts table"
    elif kind == "files":
        desc = "files: " + _special_file(rng, path)
    return path, desc


def _number_spans(text: str):
    i, n = 0, len(text)
    while i < n:
        if text[i] in "-0123456789" and (i == 0 or text[i - 1] in ":[, "):
            j = i + 1
            while j < n and text[j] in "0123456789.eE+-":
                j += 1
            yield i, j
            i = j
        else:
            i += 1


def _edit_table(rng, path, directory):
    """Change the manifest's parts table: sizes, hashes, extra or missing entries."""
    if directory:
        mpath = os.path.join(path, "manifest.json")
        doc = json.loads(open(mpath, "rb").read())
    else:
        with zipfile.ZipFile(path) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
        doc = json.loads(members["manifest.json"])
    name = rng.choice(sorted(doc["parts"]))
    edit = rng.choice(["size", "sha", "drop", "add"])
    if edit == "size":
        doc["parts"][name]["size"] = rng.choice([0, -1, True, 2 ** 40, 2 ** 63 - 1, 1.0, "1", None,
                                                  doc["parts"][name]["size"] + 1])
    elif edit == "sha":
        doc["parts"][name]["sha256"] = rng.choice(["", "0" * 64, None, 1])
    elif edit == "drop":
        del doc["parts"][name]
    else:
        doc["parts"][rng.choice(["../evil", "a/./b", "x" * 300, "extra.bin", "/abs"])] = {"size": 1, "sha256": "00"}
    blob = json.dumps(doc).encode()
    if directory:
        open(mpath, "wb").write(blob)
    else:
        members["manifest.json"] = blob
        with zipfile.ZipFile(path, "w") as z:
            for n, d in members.items():
                z.writestr(n, d)


def _special_file(rng, path) -> str:
    """Replace a part of a directory package with something that is not a regular file inside it."""
    parts = sorted(os.path.relpath(os.path.join(b, f), path) for b, _, fs in os.walk(path) for f in fs)
    name = rng.choice(parts)
    target = os.path.join(path, name)
    os.remove(target)
    choice = rng.choice(["fifo", "loop", "dangling", "outside", "device", "directory", "sparse", "link_fifo",
                         "self"])
    if choice == "fifo":
        os.mkfifo(target)
    elif choice == "link_fifo":
        os.mkfifo(target + ".pipe")
        os.symlink(os.path.basename(target) + ".pipe", target)
    elif choice == "loop":
        os.symlink(os.path.basename(target) + ".2", target)
        os.symlink(os.path.basename(target), target + ".2")
    elif choice == "self":
        os.symlink(os.path.basename(target), target)
    elif choice == "dangling":
        os.symlink("nowhere", target)
    elif choice == "outside":
        os.symlink(os.path.abspath(__file__), target)
    elif choice == "device":
        os.symlink("/dev/zero", target)
    elif choice == "directory":
        os.mkdir(target)
    else:  # a sparse part over the fuzzing limit, the manifest agreeing on its size
        size = FUZZ_LIMITS["max_part_bytes"] + rng.choice([1, 1 << 30])
        with open(target, "wb") as f:
            f.truncate(size)
        mpath = os.path.join(path, "manifest.json")
        doc = json.loads(open(mpath, "rb").read()) if name != "manifest.json" else {"parts": {}}
        if name in doc["parts"]:
            doc["parts"][name]["size"] = size
            open(mpath, "w").write(json.dumps(doc))
    return f"{choice} as {name}"


# -- ONNX ------------------------------------------------------------------------------------------------
_MODELS = None


def _onnx_models() -> dict:
    """Small valid models covering the operators whose attributes and operands the mutations reach."""
    global _MODELS
    if _MODELS is not None:
        return _MODELS
    import ml_dtypes
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper
    from onnx import numpy_helper as nh

    def vi(name, shape, dtype=T.FLOAT):
        return helper.make_tensor_value_info(name, dtype, shape)

    def model(nodes, inputs, outputs, inits=(), opset=17):
        graph = helper.make_graph(nodes, "g", inputs, outputs,
                                  initializer=[nh.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    f32 = np.float32
    rs = np.random.RandomState(0)
    n = helper.make_node
    _MODELS = {
        "cnn": model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]), n("Relu", ["c"], ["r"]),
                      n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                      n("Flatten", ["p"], ["f"], axis=1), n("Gemm", ["f", "g"], ["y"], transB=1)],
                     [vi("x", ["N", 1, 4, 4])], [vi("y", ["N", 3])],
                     {"w": rs.randn(2, 1, 3, 3).astype(f32), "b": np.zeros(2, f32), "g": rs.randn(3, 8).astype(f32)}),
        "lstm": model([n("LSTM", ["x", "w", "r"], ["y"], hidden_size=2)], [vi("x", [5, 1, 3])], [vi("y", [5, 1, 1, 2])],
                      {"w": rs.randn(1, 8, 3).astype(f32), "r": rs.randn(1, 8, 2).astype(f32)}),
        "gru": model([n("GRU", ["x", "w", "r"], ["y", "h"], hidden_size=2, direction="bidirectional")],
                     [vi("x", [3, 2, 3])], [vi("y", [3, 2, 2, 2]), vi("h", [2, 2, 2])],
                     {"w": rs.randn(2, 6, 3).astype(f32), "r": rs.randn(2, 6, 2).astype(f32)}),
        "softmax": model([n("Softmax", ["x"], ["s"], axis=-1), n("LayerNormalization", ["s", "g"], ["y"], axis=-1)],
                         [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])], {"g": np.ones(4, f32)}),
        "reshape": model([n("Shape", ["x"], ["s"]), n("Gather", ["s", "i"], ["b"], axis=0),
                          n("Concat", ["b", "m"], ["t"], axis=0), n("Reshape", ["x", "t"], ["y"])],
                         [vi("x", ["N", 2, 3])], [vi("y", ["N", 6])],
                         {"i": np.array([0], np.int64), "m": np.array([-1], np.int64)}),
        "pad": model([n("Pad", ["x", "p"], ["y"], mode="constant")], [vi("x", [2, 3])], [vi("y", [4, 4])],
                     {"p": np.array([1, 0, 1, 1], np.int64)}),
        "range": model([n("Range", ["s", "l", "d"], ["r"]), n("Add", ["x", "r"], ["y"])], [vi("x", [5], T.INT64)],
                       [vi("y", [5], T.INT64)], {"s": np.array(0, np.int64), "l": np.array(5, np.int64),
                                                 "d": np.array(1, np.int64)}),
        "constant_of_shape": model([n("ConstantOfShape", ["s"], ["c"], value=nh.from_array(np.array([2.0], f32))),
                                    n("Mul", ["x", "c"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])],
                                   {"s": np.array([2, 3], np.int64)}),
        "mod": model([n("Mod", ["x", "b"], ["y"])], [vi("x", [3], T.INT64)], [vi("y", [3], T.INT64)],
                     {"b": np.array([2, 3, 4], np.int64)}),
        "gather_elements": model([n("GatherElements", ["x", "i"], ["y"], axis=1)], [vi("x", [2, 3])],
                                 [vi("y", [2, 2])], {"i": np.array([[0, 2], [1, 0]], np.int64)}),
        "tile_expand": model([n("Tile", ["x", "t"], ["a"]), n("Expand", ["a", "e"], ["y"])], [vi("x", [1, 3])],
                             [vi("y", [2, 2, 6])], {"t": np.array([2, 2], np.int64),
                                                    "e": np.array([2, 1, 1], np.int64)}),
        "split_slice": model([n("Split", ["x", "s"], ["a", "b"], axis=1),
                              n("Slice", ["a", "st", "en", "ax", "sp"], ["y"]), n("Identity", ["b"], ["z"])],
                             [vi("x", [2, 6])], [vi("y", [2, 1]), vi("z", [2, 4])],
                             {"s": np.array([2, 4], np.int64), "st": np.array([0], np.int64),
                              "en": np.array([2], np.int64), "ax": np.array([1], np.int64),
                              "sp": np.array([2], np.int64)}),
        "reduce_topk": model([n("ReduceSum", ["x", "a"], ["r"], keepdims=1), n("TopK", ["x", "k"], ["v", "i"], axis=-1),
                              n("ArgMax", ["x"], ["m"], axis=1, keepdims=0), n("CumSum", ["x", "c"], ["y"])],
                             [vi("x", [2, 4])], [vi("r", [2, 1]), vi("v", [2, 2]), vi("i", [2, 2], T.INT64),
                                                 vi("m", [2], T.INT64), vi("y", [2, 4])],
                             {"a": np.array([1], np.int64), "k": np.array([2], np.int64), "c": np.array(1, np.int64)}),
        "pool_norm": model([n("AveragePool", ["x"], ["p"], kernel_shape=[2, 2], strides=[1, 1]),
                            n("BatchNormalization", ["p", "s", "b", "m", "v"], ["y"], epsilon=1e-5)],
                           [vi("x", [1, 2, 3, 3])], [vi("y", [1, 2, 2, 2])],
                           {"s": np.ones(2, f32), "b": np.zeros(2, f32), "m": np.zeros(2, f32), "v": np.ones(2, f32)}),
        "resize_transpose": model([n("Resize", ["x", "", "sc"], ["r"], mode="nearest"),
                                   n("Transpose", ["r"], ["y"], perm=[0, 1, 3, 2])],
                                  [vi("x", [1, 1, 2, 2])], [vi("y", [1, 1, 4, 4])],
                                  {"sc": np.array([1, 1, 2, 2], f32)}),
        "onehot_where": model([n("OneHot", ["i", "d", "v"], ["o"], axis=-1), n("Where", ["c", "o", "z"], ["y"])],
                              [vi("i", [3], T.INT64), vi("c", [3, 4], T.BOOL)], [vi("y", [3, 4])],
                              {"d": np.array(4, np.int64), "v": np.array([0, 1], f32), "z": np.zeros((3, 4), f32)}),
        "attention": model([n("Attention", ["q", "k", "v", "m"], ["y"], is_causal=1, q_num_heads=2, kv_num_heads=1)],
                           [vi("q", [1, 3, 4]), vi("k", [1, 3, 2]), vi("v", [1, 3, 2])], [vi("y", [1, 3, 4])],
                           {"m": np.ones((3, 3), bool)}, opset=23),
        "grid_scatter": model([n("GridSample", ["x", "g"], ["s"], mode="linear", padding_mode="reflection"),
                               n("ScatterElements", ["s", "i", "u"], ["y"], axis=3)],
                              [vi("x", [1, 1, 3, 3])], [vi("y", [1, 1, 2, 2])],
                              {"g": rs.uniform(-1.5, 1.5, (1, 2, 2, 2)).astype(f32),
                               "i": np.array([[[[1, 0]]]], np.int64), "u": np.ones((1, 1, 1, 2), f32)}, opset=20),
        "bits_cumprod": model([n("BitShift", ["x", "s"], ["a"], direction="LEFT"), n("BitwiseXor", ["a", "x"], ["y"]),
                               n("Cast", ["y"], ["f"], to=T.FLOAT), n("CumProd", ["f", "c"], ["z"])],
                              [vi("x", [3], T.INT32)], [vi("z", [3])],
                              {"s": np.array([1, 2, 40], np.int32), "c": np.array(0, np.int64)}, opset=28),
        "scan_dft": model([n("Scan", ["s0", "x"], ["s", "ys"], num_scan_inputs=1, body=helper.make_graph(
                               [n("Add", ["si", "row"], ["so"]), n("Identity", ["so"], ["out"])], "body",
                               [vi("si", [2]), vi("row", [2])], [vi("so", [2]), vi("out", [2])])),
                           n("Unsqueeze", ["ys", "ax"], ["c"]), n("DFT", ["c", "", "a1"], ["y"])],
                          [vi("x", [3, 2])], [vi("s", [2]), vi("y", [3, 2, 2])],
                          {"s0": np.zeros(2, f32), "ax": np.array([2], np.int64), "a1": np.array(1, np.int64)},
                          opset=20),
        "runtime_shape": model([n("Reshape", ["x", "shape"], ["y"])], [vi("x", [2, 3]), vi("shape", [2], T.INT64)],
                               [vi("y", ["a", "b"])]),
        "unsigned_float8": model([n("BitShift", ["x", "s"], ["a"], direction="LEFT"), n("Add", ["a", "x"], ["b"]),
                                  n("Mod", ["b", "m"], ["c"]), n("Cast", ["c"], ["f"], to=T.FLOAT),
                                  n("Cast", ["f"], ["e"], to=T.FLOAT8E4M3FN, saturate=0),
                                  n("Cast", ["e"], ["g"], to=T.FLOAT),
                                  n("QuantizeLinear", ["g", "sc", "zp"], ["q"]),
                                  n("DequantizeLinear", ["q", "sc", "zp"], ["y"])],
                                 [vi("x", [3], T.UINT32)], [vi("y", [3])],
                                 {"s": np.array([1, 2, 31], np.uint32), "m": np.array([3, 5, 2 ** 32 - 1], np.uint32),
                                  "sc": np.array(0.5, f32),
                                  "zp": np.zeros((), ml_dtypes.float8_e5m2)}, opset=21),
    }
    return _MODELS


_ATTR_NAMES = ["axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group", "keepdims",
               "hidden_size", "direction", "mode", "to", "split", "num_outputs", "epsilon", "alpha", "transB",
               "blocksize", "largest", "sorted", "exclusive", "reverse", "value", "allowzero", "layout"]
_ATTR_VALUES = [-100, -3, -2, -1, 0, 1, 2, 3, 7, 100, 2 ** 31, 2 ** 40, -(2 ** 62), 0.0, 1.5, float("inf"),
                float("nan"), "x", "reverse", "bidirectional", "reflect", "edge", [], [0], [-1], [0, 0], [1, 1],
                [2 ** 40, 1], [-5, -5, -5, -5], [0, 0, 0, 0], [1, 2, 3], [3, 2, 1, 0]]
_INIT_VALUES = ["zeros", "negative", "huge", "random", "nan", "empty", "dims_negative", "dims_huge", "dtype"]


def _mutate_onnx(rng: random.Random) -> tuple[bytes, str]:
    import numpy as np
    import onnx
    from onnx import helper
    from onnx import numpy_helper as nh

    name = rng.choice(sorted(_onnx_models()))
    m = copy.deepcopy(_onnx_models()[name])
    graph = m.graph
    kind = rng.choice(["attribute", "attribute", "attribute", "initializer", "initializer", "shape", "structure",
                       "structure", "bytes"])
    desc = f"{name}: {kind}"
    if kind == "attribute":
        node = rng.choice(list(graph.node))
        key = rng.choice([a.name for a in node.attribute] + _ATTR_NAMES) if node.attribute else rng.choice(_ATTR_NAMES)
        value = rng.choice(_ATTR_VALUES + ["tensor"])
        if value == "tensor":
            value = nh.from_array(np.array([1, 2], np.int64))
        for a in list(node.attribute):
            if a.name == key:
                node.attribute.remove(a)
        try:
            node.attribute.append(helper.make_attribute(key, value))
        except (ValueError, TypeError):
            pass
        desc += f" {node.op_type}.{key} = {str(value)[:30]}"
    elif kind == "initializer" and graph.initializer:
        init = rng.choice(list(graph.initializer))
        arr = nh.to_array(init)
        how = rng.choice(_INIT_VALUES)
        if how == "zeros":
            new = np.zeros_like(arr)
        elif how == "negative":
            new = -np.abs(arr) - 1 if arr.dtype != bool else arr
        elif how == "huge":
            # 2^40, or the largest value a narrower integer type holds
            new = np.full_like(arr, min(2 ** 40, np.iinfo(arr.dtype).max) if arr.dtype.kind in "iu" else 1e30) \
                if arr.dtype != bool else arr
        elif how == "random":
            # as int64, then in the array's type (wrapping for unsigned types, as a model's writer would)
            new = (rng.randint(-50, 50) * np.ones(arr.shape, np.int64)).astype(arr.dtype) if arr.dtype != bool else arr
        elif how == "nan":
            new = np.full_like(arr, np.nan) if arr.dtype.kind == "f" else arr
        elif how == "empty":
            new = np.zeros((0,), arr.dtype)
        else:
            new = arr
        proto = nh.from_array(np.asarray(new), init.name)
        if how == "dims_negative":
            proto.dims[:] = [-1] * max(len(proto.dims), 1)
        elif how == "dims_huge":
            proto.dims[:] = [2 ** 40] + list(proto.dims[1:])
        elif how == "dtype":
            proto.data_type = rng.choice([2, 4, 8, 12, 13, 14, 17, 18, 19, 20, 21, 23, 99])
        init.CopyFrom(proto)
        desc += f" {init.name} {how}"
    elif kind == "shape":
        values = list(graph.input) + list(graph.output)
        vi = rng.choice(values)
        dims = vi.type.tensor_type.shape.dim
        if dims:
            d = rng.choice(list(dims))
            v = rng.choice([-3, -1, 0, 2 ** 40, 1, 100000, "sym"])
            if v == "sym":
                d.dim_param = "q"
            else:
                d.dim_value = v
            desc += f" {vi.name} dim = {v}"
    elif kind == "structure":
        nodes = list(graph.node)
        how = rng.choice(["dup_output", "dup_init", "drop_node", "repeat_node", "op_type", "opset", "swap_inputs",
                          "drop_input", "rename_output", "many_nodes"])
        i = rng.randrange(len(nodes))
        if how == "dup_output" and len(nodes) > 1:
            nodes[i].output[0] = nodes[(i + 1) % len(nodes)].output[0]
        elif how == "dup_init" and graph.initializer:
            graph.initializer.append(copy.deepcopy(graph.initializer[0]))
        elif how == "drop_node":
            graph.node.remove(nodes[i])
        elif how == "repeat_node":
            graph.node.append(copy.deepcopy(nodes[i]))
        elif how == "op_type":
            nodes[i].op_type = rng.choice(["Softmax", "Reshape", "LSTM", "Loop", "Pad", "Conv", "Range", "Tile",
                                           "NoSuchOp", "Split", "Gather", "Slice", "ConstantOfShape"])
        elif how == "opset":
            m.opset_import[0].version = rng.choice([1, 6, 9, 11, 12, 13, 18, 21, 99])
        elif how == "swap_inputs" and len(nodes[i].input) > 1:
            nodes[i].input[0], nodes[i].input[1] = nodes[i].input[1], nodes[i].input[0]
        elif how == "drop_input" and nodes[i].input:
            del nodes[i].input[-1]
        elif how == "rename_output":
            nodes[i].output[0] = rng.choice(["", graph.input[0].name if graph.input else "x", "nowhere"])
        elif how == "many_nodes":
            graph.node.extend([helper.make_node("Identity", [graph.input[0].name], [f"id{k}"])
                               for k in range(rng.choice([10, 3000]))])
        desc += f" {how} at node {i}"
    blob = m.SerializeToString()
    if kind == "bytes":
        data = bytearray(blob)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        blob = bytes(data)
    try:
        onnx.load_model_from_string(blob)
    except Exception:  # the importer gets the bytes either way; this only names what they are
        desc += " (undecodable)"
    return blob, desc


# -- running one input -------------------------------------------------------------------------------------
def _reason(message: str) -> str:
    """A coarse class for a PackageError, for the summary."""
    for key, label in (("max_", "a limit"), ("ONNX checker", "ONNX checker"), ("FIFO", "special file"),
                       ("link", "link"), ("directory", "special file"), ("device", "special file"),
                       ("SHA-256", "hash"), ("the manifest says", "size"), ("JSON", "JSON"),
                       ("64-bit", "JSON number"), ("not finite", "JSON number"), ("invalid IR", "IR"),
                       ("malformed IR", "IR"), ("safetensors", "weights"), ("kernels[", "kernels"),
                       ("bundle", "kernels"), ("archive", "archive"), ("member", "archive"),
                       ("part", "parts"), ("not supported", "unsupported"), ("outside", "range"),
                       ("defined twice", "duplicates"), ("negative extent", "negative extent"),
                       ("not a valid ONNX", "protobuf"), ("node", "importer"), ("not listed", "parts"),
                       ("manifest", "manifest fields")):
        if key in message:
            return label
    return "other"


def _feeds(fn):
    import numpy as np

    import torch

    feeds = {}
    for port in fn.inputs:
        shape = tuple(2 if d == -1 else d for d in (port.type.shape or (2,)))
        dt = port.type.dtype
        feeds[port.name] = np.ones(shape, dt.numpy) if dt.numpy is not None else torch.ones(shape, dtype=dt.torch)
    return feeds


def run_one(kind: str, index: int, seed: int, bases, scratch: str) -> tuple[str, str]:
    """(outcome class, description) for input `index` of `kind`."""
    import stitchml as sm
    from stitchml.package import Limits

    limits = Limits(**FUZZ_LIMITS)
    rng = random.Random(f"{seed}/{kind}/{index}")
    root = tempfile.mkdtemp(dir=scratch)
    try:
        try:
            if kind == "package":
                path, desc = _mutate_package(rng, bases, root)
                build = lambda: sm.load_package(path, limits=limits)  # noqa: E731
            else:
                blob, desc = _mutate_onnx(rng)
                build = lambda: sm.package.from_onnx(blob, limits=limits)  # noqa: E731
        except TimeoutError:  # the worker's timer: a hang, counted by the worker
            raise
        except Exception as e:  # a defect of this fuzzer, not of the code under test: still a failure
            return "crash: the generator failed", f"{type(e).__name__}: {e}"
        try:
            pkg = build()
        except sm.PackageError as e:
            return f"refused: {_reason(str(e))}", desc
        except TimeoutError:  # the worker's timer: a hang, counted by the worker
            raise
        except Exception as e:  # the defect this fuzzer looks for
            return f"untyped: {type(e).__name__}", f"{desc}: {type(e).__name__}: {str(e)[:300]}"
        for fn in pkg.functions.values():
            try:
                fn(**_feeds(fn))
            except sm.StitchError as e:
                return f"loaded, run refused: {type(e).__name__}", desc
            except TimeoutError:  # the worker's timer: a hang, counted by the worker
                raise
            except Exception as e:
                return f"untyped in run: {type(e).__name__}", f"{desc}: {type(e).__name__}: {str(e)[:300]}"
        return "loaded", desc
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _worker(kind: str, start: int, stop: int, seed: int, time_limit: float) -> None:
    """Run inputs start..stop-1, one line per event on the original stdout."""
    out = os.dup(1)
    os.dup2(2, 1)  # libraries' prints go to stderr, not into the protocol
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.CRITICAL)
    bases = _base_packages() if kind == "package" else None
    # Warm up (imports, the checker's first call) so that the first input's time is its own.
    import stitchml as sm

    for model in _onnx_models().values() if kind == "onnx" else ():
        sm.package.from_onnx(model)
    # Thousands of small packages are written and removed: memory-backed storage where there is some.
    scratch = tempfile.mkdtemp(prefix="fuzz-hostile-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)

    def expire(*_):
        raise TimeoutError(f"input ran past {time_limit} s")

    signal.signal(signal.SIGALRM, expire)
    try:
        for i in range(start, stop):
            os.write(out, (json.dumps({"start": i}) + "\n").encode())
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, time_limit)
            try:
                outcome, desc = run_one(kind, i, seed, bases, scratch)
            except TimeoutError:
                outcome, desc = "hang", "interrupted by the worker's timer"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            os.write(out, (json.dumps({"done": i, "outcome": outcome, "desc": desc,
                                       "s": time.perf_counter() - t0}) + "\n").encode())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user and system)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _Tally:
    """Outcome counts, failures and the slowest input of one kind."""

    def __init__(self, kind: str, log):
        self.kind, self.log = kind, log
        self.counts: Counter = Counter()
        self.failures: list[dict] = []
        self.slowest = 0.0

    def add(self, index: int, outcome: str, desc: str, seconds: float = 0.0) -> None:
        self.counts[outcome] += 1
        if outcome.split(":")[0] in FAILURES or outcome.startswith("untyped"):
            self.failures.append({"kind": self.kind, "index": index, "outcome": outcome, "desc": desc})
            if self.log:  # at once, so that a long run stopped early still names it
                self.log(f"FAILURE {outcome}: {desc[:300]} (--only {self.kind}:{index})")
        if seconds > self.slowest:
            self.slowest = seconds
            if self.log:
                self.log(f"slowest so far: {seconds:.2f} s {self.kind}:{index} {desc[:100]}")


def _watch(proc, tally: _Tally, time_limit: float, max_rss_mb: float) -> tuple[int | None, int | None, str | None]:
    """Follow one worker until it exits or is killed: (last finished index, the index it was on, why killed)."""
    current, began, began_cpu, buf, last = None, 0.0, 0.0, b"", None
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], 0.05)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return last, current, None
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if "start" in msg:
                    current, began, began_cpu = msg["start"], time.monotonic(), _cpu_s(proc.pid)
                    continue
                tally.add(msg["done"], msg["outcome"], msg["desc"], msg["s"])
                current, last = None, msg["done"]
                if tally.log and (last + 1) % 1000 == 0:
                    tally.log(f"{tally.kind}: {sum(tally.counts.values())} done {dict(tally.counts)}")
        if current is not None:
            wall = time.monotonic() - began
            # The worker's own timer did not get it back: a hang if it spun on the CPU all along, or blocked
            # for long (on a loaded machine a starved worker can pass the wall-clock limit doing little).
            if wall > time_limit + 5 and (_cpu_s(proc.pid) - began_cpu > time_limit or wall > 6 * time_limit):
                proc.kill()
                return last, current, "hang"
            if _rss_mb(proc.pid) > max_rss_mb:
                proc.kill()
                return last, current, "memory"
        if proc.poll() is not None and not ready:
            return last, current, None


def supervise(kind: str, count: int, seed: int, time_limit: float, max_rss_mb: float, start: int = 0,
              log=None) -> tuple[Counter, list[dict], float]:
    """Run `count` inputs of `kind` in watched workers; (outcome counts, failures, slowest input's seconds)."""
    tally = _Tally(kind, log)
    i, stop = start, start + count
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    while i < stop:
        proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz_hostile", "--worker", kind, str(i), str(stop),
                                 "--seed", str(seed), "--time-limit", str(time_limit)],
                                cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            last, current, killed = _watch(proc, tally, time_limit, max_rss_mb)
        finally:
            if proc.poll() is None:  # interrupted: the worker goes with its supervisor
                proc.kill()
            proc.wait()
        if current is not None:  # the worker died or was killed on this input: count it and go on after it
            tally.add(current, killed or "crash", f"worker {'killed' if killed else f'exited with {proc.returncode}'}")
            i = current + 1
        elif last is not None and last + 1 > i:
            i = last + 1
        elif i < stop:
            raise RuntimeError(f"the {kind} worker exited with {proc.returncode} before input {i}")
    return tally.counts, tally.failures, tally.slowest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", type=int, default=2000, help="mutated packages to load (default 2000)")
    ap.add_argument("--onnx", type=int, default=500, help="mutated ONNX models to import (default 500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds one input may take (default 10)")
    ap.add_argument("--max-rss-mb", type=float, default=3000, help="worker memory that counts as a failure")
    ap.add_argument("--json", help="write the counts and failures here")
    ap.add_argument("--only", help="KIND:INDEX: run one input in this process and print its traceback")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "START", "STOP"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), args.seed, args.time_limit)
        return 0
    if args.only:
        kind, index = args.only.split(":")
        import stitchml as sm  # noqa: F401

        scratch = tempfile.mkdtemp()
        rng = random.Random(f"{args.seed}/{kind}/{index}")
        if kind == "onnx":
            blob, desc = _mutate_onnx(rng)
            print(desc)
            sm.package.from_onnx(blob, limits=sm.package.Limits(**FUZZ_LIMITS))
        else:
            path, desc = _mutate_package(rng, _base_packages(), scratch)
            print(desc, path)
            sm.load_package(path, limits=sm.package.Limits(**FUZZ_LIMITS))
        print(run_one(kind, int(index), args.seed, _base_packages() if kind == "package" else None, scratch))
        return 0
    report = {"seed": args.seed, "kinds": {}}
    bad = 0
    for kind, count in (("package", args.packages), ("onnx", args.onnx)):
        if not count:
            continue
        t0 = time.perf_counter()
        counts, failures, slowest = supervise(kind, count, args.seed, args.time_limit, args.max_rss_mb,
                                              log=lambda m: print(m, file=sys.stderr, flush=True))
        took = time.perf_counter() - t0
        report["kinds"][kind] = {"count": count, "seconds": round(took, 1), "slowest_input_s": round(slowest, 3),
                                 "outcomes": dict(counts.most_common()), "failures": failures}
        print(f"{kind}: {count} inputs in {took:.1f} s (slowest {slowest:.2f} s)")
        for outcome, n in counts.most_common():
            print(f"  {n:7d}  {outcome}")
        for f in failures:
            print(f"  FAILURE {f['outcome']}: {f['desc'][:300]}\n    reproduce: python -m tests.fuzz_hostile "
                  f"--only {f['kind']}:{f['index']} --seed {args.seed}")
        bad += len(failures)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
