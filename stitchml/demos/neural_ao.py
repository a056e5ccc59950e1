"""Neural ambient occlusion: a G-buffer from our kernels, a UNet from PyTorch on a command buffer, then a typo
in its activation found by bisection.

    $ stitchml demo neural-ao                             # 96x64 on the CPU: under a minute on two cores
    $ stitchml demo neural-ao --size 1920x1080 --device cuda
    $ stitchml demo neural-ao --serve                     # then the web debugger on the broken network

One frame is one command buffer: a compute encoder runs the G-buffer pass (a StitchML graph that
ray-casts spheres on a floor into depth and normals; stitched Triton kernels on a GPU, the same graph
op by op on the CPU), a barrier, an ML encoder dispatches the UNet (written in PyTorch, imported with
`package.from_torch`), a barrier, and a compute encoder runs the compositing graph. The UNet is trained
in PyTorch (100 steps, about 10 s of one core) to reproduce a screen-space AO computed in NumPy from
G-buffers of random scenes.

Then the same weights in a network whose `SignedSmoothstep` helper has `t * t` typed `t ** t` (the
clamped value raised to itself): the demo renders that frame too, bisects the broken package against the
fixed PyTorch module op by op (`debug.torch_program_reference`, values lined up through
`Function.origins`) and prints the first op that diverges and its source line. It writes the image
(rows: fixed, broken; columns: normals, NumPy SSAO, network AO, composite), a capture of the broken run
with the bisection, and the frames' timeline as a Perfetto trace.
"""
from __future__ import annotations

import argparse
import linecache
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import stitchml as sm
from stitchml.cli import positive

FAR = 20.0  # depth written where a ray hits nothing
EYE, TARGET, FOV = (0.0, 1.6, 4.2), (0.0, 0.45, 0.0), 0.55  # the camera: position, what it looks at, tan(half fov)
LIGHT = (0.45, 0.8, 0.4)
SCENE = np.array([[-0.9, 0.5, 0.1, 0.5], [0.35, 0.35, 0.5, 0.35], [0.2, 0.8, -0.9, 0.8],  # spheres: x, y, z, r
                  [1.2, 0.25, 1.1, 0.25], [-0.2, 0.18, 1.3, 0.18]], np.float32)


# -- the scene: rays, the G-buffer and compositing graphs -----------------------------------------
def _camera() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The camera's forward, right and up unit vectors."""
    f = np.subtract(TARGET, EYE)
    f /= np.linalg.norm(f)
    r = np.cross(f, [0.0, 1.0, 0.0])
    r /= np.linalg.norm(r)
    return f, r, np.cross(r, f)


def _screen(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres in [-1, 1] across (scaled by the aspect ratio) and down: u (1, w), v (h, 1)."""
    u = ((np.arange(w) + 0.5) / w * 2 - 1) * FOV * w / h
    v = (1 - (np.arange(h) + 0.5) / h * 2) * FOV
    return u[None, :].astype(np.float32), v[:, None].astype(np.float32)


def rays(h: int, w: int) -> np.ndarray:
    """Unit ray directions (h, w, 3) in float64, the G-buffer graph's arithmetic."""
    f, r, up = _camera()
    u, v = _screen(h, w)
    d = f + u[..., None].astype(np.float64) * r + v[..., None].astype(np.float64) * up
    return d / np.linalg.norm(d, axis=-1, keepdims=True)


def gbuffer_graph(h: int, w: int, spheres: int) -> tuple[sm.Graph, sm.Tensor, sm.Tensor]:
    """(graph, spheres placeholder (S, 4), G-buffer (1, 4, h, w): ray distance, then the world normal).

    Every pixel's ray against a floor (y = 0) and each sphere at once (axis 0 runs over the spheres);
    the nearest hit wins, FAR and a zero normal where nothing is hit.
    """
    g = sm.Graph("gbuffer")
    s = g.placeholder((spheres, 4), sm.float32, name="spheres")
    f, r, up = _camera()
    u, v = (g.constant(a) for a in _screen(h, w))
    d = [float(f[i]) + u * float(r[i]) + v * float(up[i]) for i in range(3)]  # (h, w) each
    norm = g.reverse_square_root(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
    d = [c * norm for c in d]
    col = [g.reshape(g.slice(s, [0, i], [spheres, i + 1]), (spheres, 1, 1)) for i in range(4)]
    oc = [EYE[i] - col[i] for i in range(3)]  # (S, 1, 1)
    b = oc[0] * d[0] + oc[1] * d[1] + oc[2] * d[2]  # (S, h, w)
    disc = b * b - (oc[0] * oc[0] + oc[1] * oc[1] + oc[2] * oc[2] - col[3] * col[3])
    t = -b - g.square_root(g.maximum(disc, 0.0))
    t = g.select(g.logical_and(disc > 0.0, t > 0.0), t, FAR)
    t_floor = g.select(d[1] < -1e-4, -EYE[1] / g.minimum(d[1], -1e-4), FAR)  # (h, w)
    nearest = g.reduction_minimum(t, axes=[0])
    on = g.cast(g.equal(t, nearest) & (t < FAR), sm.float32)  # the sphere each pixel sees, one-hot over S
    sphere_n = [g.reduction_sum(on * ((EYE[i] + t * d[i] - col[i]) / col[3]), axes=[0]) for i in range(3)]
    floor = t_floor < nearest
    depth = g.minimum(nearest, t_floor)
    normal = [g.select(floor, 1.0 if i == 1 else 0.0, sphere_n[i]) for i in range(3)]
    out = g.reshape(g.concat([g.reshape(c, (1, h, w)) for c in [depth, *normal]], axis=0), (1, 4, h, w),
                    name="gbuffer")
    return g, s, out


def composite_graph(h: int, w: int) -> tuple[sm.Graph, sm.Tensor, sm.Tensor, sm.Tensor]:
    """(graph, G-buffer input, AO input (1, 1, h, w), image (1, 3, h, w)): a grey clay render lit by the
    sky (scaled by the AO) and one directional light, sky colour where nothing was hit."""
    g = sm.Graph("composite")
    gb = g.placeholder((1, 4, h, w), sm.float32, name="gbuffer")
    ao = g.placeholder((1, 1, h, w), sm.float32, name="ao")
    n = [g.slice(gb, [0, i, 0, 0], [1, i + 1, h, w]) for i in range(4)]
    length = np.linalg.norm(LIGHT)
    lambert = g.maximum(sum(n[i + 1] * float(LIGHT[i] / length) for i in range(3)), 0.0)
    hit = n[0] < FAR * 0.99
    sky = g.constant(np.array([0.55, 0.7, 0.9], np.float32).reshape(1, 3, 1, 1))
    clay = g.constant(np.array([0.85, 0.8, 0.72], np.float32).reshape(1, 3, 1, 1))
    light = (0.6 * ao + 0.5 * lambert) * clay
    image = g.clamp(g.select(hit, light, sky), 0.0, 1.0, name="image")
    return g, gb, ao, image


def ssao(gbuffer: np.ndarray, radius: float = 0.5, samples: int = 24, seed: int = 0) -> np.ndarray:
    """Screen-space AO (h, w) in [0, 1] from a (4, h, w) G-buffer, in float64: for fixed disc offsets
    (scaled so that they span about `radius` world units at the median depth of what the rays hit), the mean over
    samples of how far each neighbour rises above the pixel's tangent plane, faded with distance."""
    depth, normal = gbuffer[0].astype(np.float64), np.moveaxis(gbuffer[1:].astype(np.float64), 0, -1)
    h, w = depth.shape
    pos = np.asarray(EYE) + rays(h, w) * depth[..., None]
    rng = np.random.default_rng(seed)
    angle = rng.uniform(0, 2 * np.pi, samples)
    dist = np.sqrt(rng.uniform(0.05, 1, samples))
    pixels = radius / (2 * FOV * np.median(depth[depth < FAR]) / h) if (depth < FAR).any() else 4.0
    occlusion = np.zeros((h, w))
    pad = int(np.ceil(pixels)) + 1
    padded = np.pad(pos, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    for a, r in zip(angle, dist):
        dy, dx = int(round(np.sin(a) * r * pixels)), int(round(np.cos(a) * r * pixels))
        q = padded[pad + dy:pad + dy + h, pad + dx:pad + dx + w] - pos
        length = np.linalg.norm(q, axis=-1) + 1e-6
        rise = np.clip((q * normal).sum(-1) / length - 0.05, 0, None)
        occlusion += rise / (1 + (length / radius) ** 2)
    ao = 1 - np.clip(3.0 * occlusion / samples, 0, 1)
    return np.where(depth < FAR, ao, 1.0)


def random_scene(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` spheres resting on the floor, within the camera's view."""
    r = rng.uniform(0.15, 0.7, count)
    return np.stack([rng.uniform(-1.6, 1.6, count), r, rng.uniform(-1.5, 1.5, count), r], 1).astype(np.float32)


# -- the network ---------------------------------------------------------------------------------
class SignedSmoothstep(nn.Module):
    """sign(x) * smoothstep(|x| / edge): an odd activation that saturates smoothly at +-1 beyond +-edge."""

    def __init__(self, edge: float = 2.0):
        super().__init__()
        self.edge = edge

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.clamp(x.abs() / self.edge, 0.0, 1.0)
        return torch.sign(x) * (t * t * (3.0 - 2.0 * t))


class SignedSmoothstepTypo(SignedSmoothstep):
    """The helper as it was typed: `t * t` became `t ** t`, the clamped value raised to itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.clamp(x.abs() / self.edge, 0.0, 1.0)
        return torch.sign(x) * (t ** t * (3.0 - 2.0 * t))


class Block(nn.Module):
    """Convolution, batch normalisation (which keeps the activation's inputs where it is not flat), activation."""

    def __init__(self, cin: int, cout: int, act: type[nn.Module]):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(cout)
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class UNet(nn.Module):
    """G-buffer (N, 4, H, W) in, AO (N, 1, H, W) out; two 2x poolings, so H and W must be multiples of 4."""

    def __init__(self, width: int = 8, act: type[nn.Module] = SignedSmoothstep):
        super().__init__()
        self.enc1, self.enc2 = Block(4, width, act), Block(width, 2 * width, act)
        self.mid = Block(2 * width, 2 * width, act)
        self.dec2, self.dec1 = Block(4 * width, 2 * width, act), Block(3 * width, width, act)
        self.head = nn.Conv2d(width, 1, 1)
        self.pool, self.up = nn.AvgPool2d(2), nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, gbuffer: torch.Tensor) -> torch.Tensor:
        x = torch.cat([gbuffer[:, :1] * (1.0 / FAR), gbuffer[:, 1:]], 1)
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up(d2), e1], 1))
        return torch.sigmoid(self.head(d1))


def train(gbuffer, steps: int, scenes: int = 8, seed: int = 0, log_every: int = 0) -> tuple[UNet, list[float]]:
    """The UNet fitted with Adam to NumPy SSAO on the G-buffers (1, 4, h, w) that `gbuffer(spheres)` renders
    of `scenes` random scenes, all of them each step."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    frames = np.stack([gbuffer(random_scene(rng, SCENE.shape[0]))[0] for _ in range(scenes)])
    targets = np.stack([ssao(f) for f in frames])[:, None]
    x, y = torch.from_numpy(frames), torch.from_numpy(targets.astype(np.float32))
    net = UNet()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 0.02 * 0.5 * (1 + np.cos(np.pi * step / steps)) + 1e-4
        loss = torch.mean((net(x) - y) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"  step {step:4d}  loss {losses[-1]:.5f}")
    return net.eval(), losses


def broken_copy(net: UNet) -> UNet:
    """The same weights in the network with the typo."""
    broken = UNet(act=SignedSmoothstepTypo)
    broken.load_state_dict(net.state_dict())
    return broken.eval()


# -- the frame on a command buffer ---------------------------------------------------------------------
@dataclass
class Frame:
    """Everything one frame needs on one device: the compiled passes, the network's pipeline and heap,
    and the tensors the passes share (bound once, zero copy)."""

    device: sm.Device
    spheres: sm.TensorData
    gbuffer: sm.TensorData
    ao: sm.TensorData
    image: sm.TensorData
    render: object  # the G-buffer executable
    shade: object  # the compositing executable
    outputs: tuple  # (G-buffer tensor, image tensor) of those graphs
    pipeline: object
    heap: object

    @classmethod
    def build(cls, fn, h: int, w: int, dev: sm.Device, spheres: np.ndarray, label: str = "ao") -> "Frame":
        g, s, out = gbuffer_graph(h, w, spheres.shape[0])
        sp = sm.TensorData(torch.from_numpy(spheres).to(dev.torch_device))
        render = g.compile({s: sp}, [out], device=dev.torch_device)
        cg, gin, aoin, image = composite_graph(h, w)
        gbuf, ao = dev.new_tensor((1, 4, h, w), sm.float32), dev.new_tensor((1, 1, h, w), sm.float32)
        shade = cg.compile({gin: gbuf, aoin: ao}, [image], device=dev.torch_device)
        desc = sm.MLPipelineDescriptor(fn, label=label)
        pipeline = sm.Compiler(dev).new_ml_pipeline(desc)
        return cls(dev, sp, gbuf, ao, dev.new_tensor((1, 3, h, w), sm.float32), render, shade, (out, image),
                   pipeline, dev.new_heap(pipeline.intermediates_heap_size))

    def encode(self, queue, label: str):
        """One command buffer: G-buffer pass, barrier, the network, barrier, compositing."""
        (gout, image), (gin, aoin) = self.outputs, self.shade.graph.placeholders
        feeds_render, render_out = {self.render.graph.placeholders[0]: self.spheres}, {gout: self.gbuffer}
        feeds_shade, shade_out = {gin: self.gbuffer, aoin: self.ao}, {image: self.image}
        cb = queue.command_buffer(label)
        with cb.compute_encoder("gbuffer") as ce:
            ce.dispatch(self.render.run, feeds_render, render_out, name="gbuffer: depth + normals")
        cb.barrier(after="dispatch", before="machine_learning")
        ml = cb.ml_encoder("network")
        ml.set_pipeline(self.pipeline)
        ml.set_argument_table({self.pipeline_input: self.gbuffer, "output": self.ao})
        ml.dispatch_network(self.heap)
        ml.end()
        cb.barrier(after="machine_learning", before="dispatch")
        with cb.compute_encoder("composite") as ce:
            ce.dispatch(self.shade.run, feeds_shade, shade_out, name="composite")
        return cb

    @property
    def pipeline_input(self) -> str:
        return next(iter(self.pipeline.input_types))


def import_network(net: UNet, h: int, w: int) -> sm.package.Function:
    """The network as a package function for (1, 4, h, w) G-buffers (torch.export, then our importer)."""
    return sm.package.from_torch(net, (torch.zeros(1, 4, h, w),)).function()


def bisect_typo(fixed: UNet, broken_fn, gbuffer: np.ndarray, device=None, tolerance: float = 1e-4):
    """Bisect the broken package function against the fixed PyTorch module on one G-buffer (1, 4, h, w);
    values are matched op by op through the function's origins."""
    from stitchml import debug

    name = broken_fn.inputs[0].name
    reference = debug.torch_program_reference(fixed, (torch.from_numpy(gbuffer),), inputs=[name])
    return debug.bisect(broken_fn.graph, {name: gbuffer}, reference, names=broken_fn.origin_names(),
                        tolerance=tolerance, device=device)


def source_text(location: str) -> str:
    """The source line at ``file:line``, stripped ('' when it cannot be read)."""
    path, _, line = location.rpartition(":")
    return linecache.getline(path, int(line)).strip() if line.isdigit() else ""


def save_image(path: str, rows: list[list[np.ndarray]]) -> None:
    """A PNG of panels (each (h, w) grey or (3, h, w) colour in [0, 1]), rows of columns."""
    from PIL import Image

    def rgb(a):
        a = np.asarray(a, np.float64)
        return np.repeat(a[..., None], 3, -1) if a.ndim == 2 else np.moveaxis(a, 0, -1)

    picture = np.concatenate([np.concatenate([rgb(p) for p in row], 1) for row in rows], 0)
    Image.fromarray(np.round(np.clip(picture, 0, 1) * 255).astype(np.uint8)).save(path)


def _size(text: str) -> tuple[int, int]:
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit() or int(w) % 4 or int(h) % 4 or not int(w) or not int(h):
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, both positive multiples of 4, got {text!r}")
    return int(w), int(h)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo neural-ao", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=_size, default=(96, 64), metavar="WxH",
                        help="frame size, multiples of 4 (default 96x64)")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: CUDA when present, else the CPU")
    parser.add_argument("--steps", type=positive(int), default=100, help="training steps in PyTorch (default 100)")
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: half the cores, see `stitchml doctor`)")
    parser.add_argument("--bisect-size", type=_size, default=(96, 64), metavar="WxH",
                        help="the G-buffer the bisection and capture run on (default 96x64)")
    parser.add_argument("--out", default="neural_ao.png", help="the image (default %(default)s); the capture "
                        "and the trace are written beside it (.capture, .trace.json)")
    parser.add_argument("--serve", action="store_true", help="then open the web debugger on the capture and trace")
    parser.add_argument("--port", type=int, default=8765, help="the web debugger's port (default 8765)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was asked for but no CUDA device is available (see `stitchml doctor`)")
    if args.serve:
        try:
            import flask  # noqa: F401
        except ImportError:
            parser.error("--serve needs the web debugger's Flask: pip install 'stitchml[debug]'")
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        parser.error(f"--out {args.out!r}: the folder {folder!r} does not exist")
    from stitchml import debug
    from stitchml.demos import default_threads

    torch.set_num_threads(args.threads or default_threads())
    (w, h), (bw, bh) = args.size, args.bisect_size
    stem = os.path.splitext(args.out)[0]
    dev = sm.device(device)
    start = time.perf_counter()
    print(f"training the UNet for {args.steps} steps on NumPy SSAO of random scenes (PyTorch, CPU)")
    small = gbuffer_graph(48, 64, SCENE.shape[0])
    net, losses = train(lambda s: small[0].run({small[1]: s}, [small[2]], device="cpu")[small[2]].numpy(),
                        args.steps, seed=args.seed, log_every=max(args.steps // 3, 1))
    print(f"trained: mean squared error to the NumPy SSAO {losses[-1]:.4f} (from {losses[0]:.4f})")
    broken = broken_copy(net)
    fixed_fn, broken_fn = import_network(net, h, w), import_network(broken, h, w)
    frames = {"fixed": Frame.build(fixed_fn, h, w, dev, SCENE, "unet"),
              "broken": Frame.build(broken_fn, h, w, dev, SCENE, "unet (typo)")}
    queue = dev.new_command_queue("graphics", timestamps=dev.is_cuda)
    buffers, timings = [], {}
    for name, frame in frames.items():
        for i in range(2):  # the first frame's launches warm up; the second is the one timed and kept
            cb = frame.encode(queue, f"{name} frame {i}")
            t0 = time.perf_counter()
            cb.commit()
            cb.wait()
            timings[name] = time.perf_counter() - t0
            if cb.error is not None:
                raise cb.error
        buffers.append(cb)
    gbuf = frames["fixed"].gbuffer.torch().cpu().numpy()
    with torch.no_grad():
        want = net(torch.from_numpy(gbuf)).numpy()
    got = frames["fixed"].ao.torch().cpu().numpy()
    error = float(np.abs(got - want).max())
    print(f"frame {w}x{h} on {dev.name}: {timings['fixed'] * 1e3:.1f} ms (G-buffer, UNet, composite on one "
          f"command buffer); network vs PyTorch max |error| {error:.2e}")
    rows = [[gbuf[0, 1:] * 0.5 + 0.5, ssao(gbuf[0]), frames[k].ao.torch().cpu().numpy()[0, 0],
             frames[k].image.torch().cpu().numpy()[0]] for k in frames]
    save_image(args.out, rows)
    sm.write_trace(stem + ".trace.json", buffers)
    print(f"wrote {args.out} (rows: fixed, broken; columns: normals, NumPy SSAO, network AO, composite) and "
          f"{stem}.trace.json")

    print(f"\nthe broken frame's AO differs by up to "
          f"{float(np.abs(frames['broken'].ao.torch().cpu().numpy() - want).max()):.3f}; bisecting the broken "
          f"package against the fixed PyTorch module on a {bw}x{bh} G-buffer")
    sg = gbuffer_graph(bh, bw, SCENE.shape[0])
    probe_gbuf = sg[0].run({sg[1]: SCENE}, [sg[2]], device="cpu")[sg[2]].numpy()
    small_broken = import_network(broken, bh, bw) if (bw, bh) != (w, h) else broken_fn
    result = bisect_typo(net, small_broken, probe_gbuf, device=dev.torch_device)
    print(result.summary())
    if result.op is not None:
        print(f"  {result.op.location}:  {source_text(result.op.location)}")
    cap = debug.capture_bisection(small_broken.graph, {small_broken.inputs[0].name: probe_gbuf}, result)
    cap.save(stem + ".capture")
    print(f"wrote {stem}.capture (open it with: stitchml debug {stem}.capture {stem}.trace.json)")
    print(f"done in {time.perf_counter() - start:.1f} s")
    if args.serve:
        debug.serve([stem + ".capture", stem + ".trace.json"], port=args.port)
    # On a GPU the convolutions may run in TF32, as PyTorch's own do by default.
    return 0 if error < (1e-2 if dev.is_cuda else 1e-4) and result.op is not None and result.op.op == "power" else 1
