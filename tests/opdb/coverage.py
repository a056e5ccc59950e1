"""The one list of primitives the generic test templates leave out, each with its reason.

tests/test_opdb_complete.py holds every registered primitive (stitchml.registry) to its record:
it must have one, the compiler fuzzer must draw it (the record's `fuzz`), and the compiled
sample graphs must be able to check it against its reference (the record's `ref`), unless the
primitive is named here. An entry whose reason no longer holds (the op gained a record, a `fuzz`
or a reference) fails that test too, so the lists stay true.
"""
from __future__ import annotations

_SYMBOLIC = ("the importers' movement for extents known only at run time: the fuzzer's graphs have static "
             "shapes, which the builders' reshape and broadcast_to (drawn) express; its opdb samples with symbolic "
             "extents compile in test_compiler.py")
_GRADIENT_ONLY = ("a primitive that only graph.gradients emits: the fuzzer builds forward graphs; its opdb samples "
                  "compile in test_compiler.py")
_OPAQUE = ("opaque: it runs through its reference implementation between kernels, so there is no code of the "
           "compiler's to fuzz; its opdb samples compile in test_compiler.py")

# Registered primitives with no opdb record.
NO_RECORD: dict[str, str] = {
    "fusion": "made by the fusion pass from primitives that have records, never built through a Graph method; "
              "test_compiler.py checks the kernels it becomes",
}

# Registered primitives (with a record) that the compiler fuzzer does not draw.
NOT_FUZZED: dict[str, str] = {
    "stop_gradient": "identity in value; the fuzzer compares values only, so it would repeat `identity`",
    "placeholder": "every fuzzed graph's inputs are placeholders (Replay._input)",
    "constant": "every scalar operand of the fuzzer's guards and scalings becomes a constant",
    "variable": "state: the fuzzer's graphs are pure functions of their placeholders",
    "read_variable": "state: the fuzzer's graphs are pure functions of their placeholders",
    "assign_variable": "state: the fuzzer's graphs are pure functions of their placeholders",
    **dict.fromkeys(["random_uniform", "random_normal"], "random: test_compiler.py checks seeded compiled draws "
                    "against eager's, test_ops.py the record's distribution check"),
    **dict.fromkeys(["sum_to_shape", "slice_gradient", "convolution2d_weights_gradient", "max_pooling2d_gradient",
                     "avg_pooling2d_gradient", "max_pooling2d_select", "resize_gradient"], _GRADIENT_ONLY),
    **dict.fromkeys(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce_to_root", "collective_wait"],
                    "collective: opaque between kernels, and the identity in the fuzzer's single process; "
                    "tests/test_distributed.py runs them across gloo processes"),
    **dict.fromkeys(["element_count", "one_hot", "max_pooling2d", "avg_pooling2d", "resize", "cumulative_sum",
                     "top_k"], _OPAQUE),
    **dict.fromkeys(["if_then_else", "while_loop", "for_loop"],
                    "control flow: its blocks are graphs of primitives the fuzzer draws, and the step that runs "
                    "them compiles each block with the same pipeline; the blocks' opdb samples compile in "
                    "test_compiler.py and tests/test_control_flow.py checks compiled loops against eager"),
    **dict.fromkeys(["scatter_add", "scatter_add_along_axis", "convolution_transpose2d", "einsum"], _OPAQUE),
    **dict.fromkeys(["reshape_with_dims", "broadcast_with_dims"], _SYMBOLIC),
}

# Registered primitives whose record the compiled sample graphs cannot check against a reference.
NOT_COMPILED: dict[str, str] = dict.fromkeys(
    ["random_uniform", "random_normal"], "random: no reference value (the record has a distribution `check`); "
    "test_compiler.py checks seeded compiled draws against eager's")
