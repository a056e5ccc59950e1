"""The neural-AO walk-through: the G-buffer graph against a NumPy ray caster, the imported UNet on a command
buffer against PyTorch, the typo found by bisection against the fixed module, and the demo end to end."""
import inspect
import json
import math

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml import debug
from stitchml.demos import neural_ao as ao

H, W = 24, 32
TIMELINE = [("compute", "gbuffer"), ("barrier", ""), ("ml", "network"), ("barrier", ""), ("compute", "composite")]


def _gbuffer_numpy(h, w, spheres):
    """Depth and normals by ray casting in float64, written independently of the graph."""
    d = ao.rays(h, w)
    eye = np.array(ao.EYE)
    depth, normal = np.full((h, w), ao.FAR), np.zeros((h, w, 3))
    floor_t = np.where(d[..., 1] < -1e-4, -eye[1] / np.minimum(d[..., 1], -1e-4), ao.FAR)
    for cx, cy, cz, r in spheres.astype(np.float64):
        oc = eye - [cx, cy, cz]
        b = d @ oc
        disc = b * b - (oc @ oc - r * r)
        t = -b - np.sqrt(np.maximum(disc, 0))
        near = (disc > 0) & (t > 0) & (t < depth)
        depth = np.where(near, t, depth)
        normal = np.where(near[..., None], (eye + t[..., None] * d - [cx, cy, cz]) / r, normal)
    floor = floor_t < depth
    depth = np.minimum(depth, floor_t)
    normal = np.where(floor[..., None], [0.0, 1.0, 0.0], normal)
    return np.concatenate([depth[None], np.moveaxis(normal, -1, 0)])[None]


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    net = ao.UNet().eval()  # seeded weights: the tooling, not the AO, is under test here
    return net, ao.broken_copy(net)


@pytest.fixture(scope="module")
def gbuffer():
    g, s, out = ao.gbuffer_graph(H, W, ao.SCENE.shape[0])
    return g.run({s: ao.SCENE}, [out], device="cpu")[out].numpy()


def test_gbuffer_graph_matches_a_numpy_ray_caster(gbuffer):
    want = _gbuffer_numpy(H, W, ao.SCENE)
    hit = want[0, 0] < ao.FAR
    assert 0.2 < hit.mean() < 1 and (want[0, 2][hit] == 1).mean() > 0.2  # floor and spheres both in view
    same = np.abs(gbuffer[0, 0] - want[0, 0]) < 1e-4
    assert same.mean() > 0.99  # a float32 rim pixel may see the other surface
    np.testing.assert_allclose(gbuffer[0, 1:, same], want[0, 1:, same], atol=1e-4)


def test_the_frame_on_a_command_buffer_matches_pytorch(nets, gbuffer):
    net, _ = nets
    fn = ao.import_network(net, H, W)
    dev = sm.device("cpu")
    frame = ao.Frame.build(fn, H, W, dev, ao.SCENE)
    cb = frame.encode(dev.new_command_queue("test"), "frame")
    cb.commit()
    cb.wait()
    assert cb.error is None
    assert [(s.kind, s.encoder) for s in cb.timeline] == TIMELINE
    np.testing.assert_array_equal(frame.gbuffer.numpy(), gbuffer)
    with torch.no_grad():
        want = net(torch.from_numpy(gbuffer)).numpy()
    np.testing.assert_allclose(frame.ao.numpy(), want, atol=1e-5)
    image = frame.image.numpy()[0]
    sky = gbuffer[0, 0] >= ao.FAR
    np.testing.assert_allclose(image[:, sky], np.array([[0.55], [0.7], [0.9]]).repeat(sky.sum(), 1), atol=1e-6)
    n = gbuffer[0, 1:]
    lambert = np.maximum(np.tensordot(np.array(ao.LIGHT) / np.linalg.norm(ao.LIGHT), n, 1), 0)
    clay = np.array([0.85, 0.8, 0.72])[:, None, None]
    expect = np.clip((0.6 * want[0, 0] + 0.5 * lambert) * clay, 0, 1)
    np.testing.assert_allclose(image[:, ~sky], expect[:, ~sky], atol=1e-5)


def test_bisection_finds_the_power_the_typo_made_in_few_probes(nets, gbuffer):
    net, broken = nets
    fn = ao.import_network(broken, H, W)
    r = ao.bisect_typo(net, fn, gbuffer)
    assert r.op is not None and r.op.op == "power" and r.op.scope == "enc1.act"
    assert r.probes <= 1 + math.ceil(math.log2(r.compared)) and r.compared > 50
    lines, first = inspect.getsourcelines(ao.SignedSmoothstepTypo.forward)
    typo = first + next(i for i, line in enumerate(lines) if "t ** t" in line)
    assert r.op.location == f"{inspect.getsourcefile(ao.SignedSmoothstepTypo)}:{typo}"
    assert "t ** t" in ao.source_text(r.op.location)
    seen = {}
    net.enc1.norm.register_forward_hook(lambda m, a, out: seen.__setitem__("x", out.double()))
    with torch.no_grad():
        net(torch.from_numpy(gbuffer))
    t = torch.clamp(seen["x"].abs() / net.enc1.act.edge, 0, 1).numpy()
    np.testing.assert_allclose(r.expected, t * t, atol=1e-5)  # the fixed module's value of that op
    np.testing.assert_allclose(r.ours, t ** t, atol=1e-5)
    fixed = ao.bisect_typo(net, ao.import_network(net, H, W), gbuffer)
    assert fixed.op is None and fixed.probes == 1 and fixed.compared == r.compared


def test_demo_writes_the_image_the_capture_and_the_trace(tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "ao.png"
    assert ao.main(["--size", f"{W}x{H}", "--bisect-size", f"{W}x{H}", "--steps", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first divergence at power" in text and "t ** t" in text
    assert Image.open(out).size == (4 * W, 2 * H)
    picture = np.asarray(Image.open(out), np.float64)
    assert np.abs(picture[:H, 2 * W:3 * W] - picture[H:, 2 * W:3 * W]).max() > 50  # the typo shows
    cap = debug.load_capture(tmp_path / "ao.capture")
    assert cap.bisect["op"]["op"] == "power" and "t ** t" in ao.source_text(cap.bisect["op"]["location"])
    assert cap.reference_tensor(cap.bisect["tensor"]) is not None
    trace = json.loads((tmp_path / "ao.trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"gbuffer: depth + normals", "composite"} <= names and any("unet" in str(n) for n in names)


def test_demo_refuses_sizes_that_do_not_pool(capsys):
    with pytest.raises(SystemExit) as e:
        ao.main(["--size", "30x24"])
    assert e.value.code == 2 and "multiples of 4" in capsys.readouterr().err
