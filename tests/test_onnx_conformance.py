"""The ONNX project's backend node tests for the in-scope operators, through the importer and the eager executor.

Cases come from stitchml.package.conformance (the shipped data folder, or the
onnx package's own case definitions). Each in-scope case must pass, except
the known failures below, which must fail: a fix shows up as an unexpected
pass and the entry is removed. docs/onnx_conformance.md has the full run.
"""
import pytest

from stitchml.package import conformance

_3D = "3-D pooling and convolution are not supported (the 2-D primitives only)"
_TRAINING = "training-mode Dropout and BatchNormalization: packages run inference"
_EMPTY = "reduction over an empty axis: torch.amax/amin refuse; ONNX wants -inf/+inf"
_RANGE_LOOP = "the expanded Range test uses a Loop (control flow is not supported)"
_ANTIALIAS = "Resize with antialias is not supported"
KNOWN = {
    "test_averagepool_2d_dilations": "avg_pooling2d supports dilation 1 only",
    "test_averagepool_3d_default": _3D,
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False": _3D,
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True": _3D,
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False": _3D,
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True": _3D,
    "test_averagepool_3d_dilations_small": _3D,
    "test_convtranspose_3d": _3D,
    "test_maxpool_3d_default": _3D,
    "test_maxpool_3d_dilations": _3D,
    "test_maxpool_3d_dilations_use_ref_impl": _3D,
    "test_maxpool_3d_dilations_use_ref_impl_large": _3D,
    "test_batchnorm_epsilon_training_mode": _TRAINING,
    "test_batchnorm_example_training_mode": _TRAINING,
    "test_training_dropout": _TRAINING,
    "test_training_dropout_default": _TRAINING,
    "test_training_dropout_default_mask": _TRAINING,
    "test_training_dropout_mask": _TRAINING,
    "test_training_dropout_zero_ratio": _TRAINING,
    "test_training_dropout_zero_ratio_mask": _TRAINING,
    "test_lstm_with_peepholes": "sequence_lens is not supported",
    "test_maxpool_with_argmax_2d_precomputed_pads": "MaxPool's Indices output is not supported",
    "test_maxpool_with_argmax_2d_precomputed_strides": "MaxPool's Indices output is not supported",
    "test_range_bfloat16_type_positive_delta_expanded": _RANGE_LOOP,
    "test_range_float16_type_positive_delta_expanded": _RANGE_LOOP,
    "test_range_float_type_positive_delta_expanded": _RANGE_LOOP,
    "test_range_int32_type_negative_delta_expanded": _RANGE_LOOP,
    "test_reduce_log_sum_exp_empty_set": _EMPTY,
    "test_reduce_max_empty_set": _EMPTY,
    "test_reduce_max_empty_set_bool": _EMPTY,
    "test_reduce_min_empty_set": _EMPTY,
    "test_resize_downsample_scales_cubic_antialias": _ANTIALIAS,
    "test_resize_downsample_scales_linear_antialias": _ANTIALIAS,
    "test_resize_downsample_sizes_cubic_antialias": _ANTIALIAS,
    "test_resize_downsample_sizes_linear_antialias": _ANTIALIAS,
    "test_spacetodepth_crd_mode_example": "SpaceToDepth has no mode attribute; the CRD variant does not match",
}

_CASES = {c.name: c for c in conformance.cases_for(in_scope_only=True)}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_node(name):
    failure = conformance.check(_CASES[name])
    if name in KNOWN:
        assert failure is not None, f"{name} passes now; remove it from KNOWN ({KNOWN[name]})"
    else:
        assert failure is None, failure


def test_known_failures_are_in_scope_cases():
    assert set(KNOWN) <= set(_CASES)


def test_in_scope_pass_rate_meets_the_target():
    assert 1 - len(KNOWN) / len(_CASES) >= 0.90
