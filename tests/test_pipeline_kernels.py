"""What a packaged network's dispatch runs, checked on the CPU: pooling as one torch call where torch's rules
are ours (against float64 references and the general path), and measured choices that time the GPU's work
behind a spin rather than the host's enqueueing."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import stitchml as sm
from stitchml.ops import contraction
from stitchml.runtime import choices

CASES = [(k, s, p, ceil, include)
         for k, s, p, ceil, include in itertools.product([(2, 2), (3, 3), (3, 2)], [(1, 1), (2, 2), (2, 1)],
                                                           [(0, 0), (1, 1), (1, 0)], [False, True], [True, False])
         if 2 * p[0] <= k[0] and 2 * p[1] <= k[1]]


def _attrs(k, s, p, ceil, include):
    return dict(kernel_size=k, stride=s, dilation=(1, 1), padding=(p[0], p[0], p[1], p[1]), ceil_mode=ceil,
                data_layout="NCHW", include_zero_padding=include)


@pytest.mark.parametrize("k,s,p,ceil,include", CASES)
def test_pooling_matches_torch_in_float64(k, s, p, ceil, include):
    x = torch.randn(2, 3, 7, 8, generator=torch.Generator().manual_seed(len(str((k, s, p)))))
    attrs = _attrs(k, s, p, ceil, include)
    want_avg = F.avg_pool2d(x.double(), k, s, p, ceil, include)
    want_max = F.max_pool2d(x.double(), k, s, p, 1, ceil)
    got_avg, got_max = contraction.avg_pooling2d.impl(x, **attrs), contraction.max_pooling2d.impl(x, **attrs)
    assert got_avg.shape == want_avg.shape and got_max.shape == want_max.shape
    assert (got_avg.double() - want_avg).abs().max() <= 1e-6 * want_avg.abs().max()
    assert torch.equal(got_max.double(), want_max)


def test_pooling_without_ceil_mode_is_one_torch_call(monkeypatch):
    """No padded copy (F.pad) and no divisor computed per run: torch's own pooling alone."""
    def refused(*args, **kwargs):
        raise AssertionError("F.pad called")

    monkeypatch.setattr(contraction.F, "pad", refused)
    x = torch.randn(1, 2, 9, 9)
    for p, include in [((0, 0), True), ((1, 1), True), ((1, 1), False)]:
        attrs = _attrs((3, 3), (2, 2), p, False, include)
        y = contraction.avg_pooling2d.impl(x, **attrs)
        assert torch.allclose(y, F.avg_pool2d(x, 3, 2, p, False, include), atol=1e-6)
        assert torch.equal(contraction.max_pooling2d.impl(x, **attrs), F.max_pool2d(x, 3, 2, p))
    with pytest.raises(AssertionError, match="F.pad called"):  # asymmetric padding keeps the general path
        contraction.avg_pooling2d.impl(x, **dict(_attrs((3, 3), (2, 2), (1, 1), False, True), padding=(1, 0, 1, 0)))


def test_zoo_network_with_pooling_matches_pytorch():
    from stitchml.package import zoo

    model, (x,) = zoo.build("resnet18")  # 3x3 max pooling with padding 1, global average pooling
    with torch.no_grad():
        want = model.double()(x.double())
    model.float()
    fn = sm.package.from_torch(model, (x,)).function()
    out = fn(**{fn.inputs[0].name: sm.TensorData(x)})
    out = next(iter(out.values())) if isinstance(out, dict) else out
    got = torch.as_tensor(out.numpy()).double()
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_measured_choice_times_behind_a_spin(monkeypatch):
    """The start event is recorded after the spin is enqueued and before the candidate runs."""
    log = []

    class Event:
        def __init__(self, enable_timing=False):
            self.name = "start" if not any(e == "event" for e in log) else "end"
            log.append("event")

        def record(self, stream=None):
            log.append(f"record {self.name}")

        def synchronize(self):
            log.append(f"synchronize {self.name}")

        def elapsed_time(self, other):
            return 0.25

    monkeypatch.setattr(choices.torch.cuda, "Event", Event)
    monkeypatch.setattr(choices.torch.cuda, "_sleep", lambda cycles: log.append(f"spin {cycles}"), raising=False)
    ms = choices._time(lambda env: log.append("candidate"), [])
    assert ms == 0.25
    assert [e for e in log if e != "event"] == [f"spin {choices.SPIN_CYCLES}", "record start", "candidate",
                                                "record end", "synchronize end"]
