"""A frame on one command buffer: render depth and normals, shade them with a network, composite.

    $ python examples/timeline.py --device cpu --out timeline.json     # then open it in ui.perfetto.dev

1. a compute encoder runs a Triton kernel that ray-casts a few spheres into a
   (1, 4, H, W) tensor: depth and the three normal components;
2. a barrier, then an ML encoder dispatches a small network, built offline
   from a torch module into a package and loaded back, on that tensor;
3. a barrier, then a compute kernel composites the network's colour over a
   background with depth fog;
4. the command buffers' timelines (one buffer a frame; the first frame also
   compiles the kernels) are written as a Chrome/Perfetto trace.

On the CPU the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1,
set here before Triton is imported) or, with --kernels torch, as torch ops.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch


def render_torch(frame: torch.Tensor, centers: torch.Tensor, radii: torch.Tensor) -> None:
    """The renderer as torch ops: depth and normals of the nearest sphere hit by each orthographic ray."""
    _, _, h, w = frame.shape

    def axis(n):  # the kernel's arithmetic, so that pixels on a sphere's rim agree
        return torch.arange(n, dtype=torch.float32, device=frame.device) / (n - 1) * 2.0 - 1.0

    ys, xs = torch.meshgrid(axis(h), axis(w), indexing="ij")
    depth = torch.full((h, w), 4.0, device=frame.device)
    normal = torch.zeros(3, h, w, device=frame.device)
    for (cx, cy, cz), r in zip(centers.tolist(), radii.tolist()):
        d2 = (xs - cx) ** 2 + (ys - cy) ** 2
        hit = d2 < r * r
        z = cz - torch.sqrt(torch.clamp(r * r - d2, min=0.0))
        nearer = hit & (z < depth)
        depth = torch.where(nearer, z, depth)
        for i, comp in enumerate(((xs - cx) / r, (ys - cy) / r, (z - cz) / r)):
            normal[i] = torch.where(nearer, comp, normal[i])
    frame[0, 0] = depth
    frame[0, 1:] = normal


def composite_torch(out: torch.Tensor, colour: torch.Tensor, frame: torch.Tensor) -> None:
    fog = torch.clamp((frame[:, :1] - 1.0) / 3.0, 0.0, 1.0)
    background = torch.tensor([0.2, 0.3, 0.5], device=out.device).reshape(1, 3, 1, 1)
    out.copy_(colour * (1 - fog) + background * fog)


def triton_kernels():
    """The renderer and the compositor as Triton kernels (imported only when asked for)."""
    import triton
    import triton.language as tl

    @triton.jit
    def render(frame_ptr, spheres_ptr, n_spheres, h, w, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < h * w
        px = (offs % w).to(tl.float32) / (w - 1) * 2.0 - 1.0
        py = (offs // w).to(tl.float32) / (h - 1) * 2.0 - 1.0
        depth = tl.full((BLOCK,), 4.0, tl.float32)
        nx = tl.zeros((BLOCK,), tl.float32)
        ny = tl.zeros((BLOCK,), tl.float32)
        nz = tl.zeros((BLOCK,), tl.float32)
        for s in range(n_spheres):
            cx = tl.load(spheres_ptr + 4 * s)
            cy = tl.load(spheres_ptr + 4 * s + 1)
            cz = tl.load(spheres_ptr + 4 * s + 2)
            r = tl.load(spheres_ptr + 4 * s + 3)
            d2 = (px - cx) * (px - cx) + (py - cy) * (py - cy)
            z = cz - tl.sqrt(tl.maximum(r * r - d2, 0.0))
            nearer = (d2 < r * r) & (z < depth)
            depth = tl.where(nearer, z, depth)
            nx = tl.where(nearer, (px - cx) / r, nx)
            ny = tl.where(nearer, (py - cy) / r, ny)
            nz = tl.where(nearer, (z - cz) / r, nz)
        plane = h * w
        tl.store(frame_ptr + offs, depth, mask=inside)
        tl.store(frame_ptr + plane + offs, nx, mask=inside)
        tl.store(frame_ptr + 2 * plane + offs, ny, mask=inside)
        tl.store(frame_ptr + 3 * plane + offs, nz, mask=inside)

    @triton.jit
    def composite(out_ptr, colour_ptr, frame_ptr, plane, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < plane
        fog = tl.minimum(tl.maximum((tl.load(frame_ptr + offs, mask=inside) - 1.0) / 3.0, 0.0), 1.0)
        for c in tl.static_range(3):  # fog colour (0.2, 0.3, 0.5) = 0.2 + 0.1 c + 0.05 c (c - 1)
            bg = 0.2 + 0.1 * c + 0.05 * c * (c - 1)
            v = tl.load(colour_ptr + c * plane + offs, mask=inside)
            tl.store(out_ptr + c * plane + offs, v * (1.0 - fog) + bg * fog, mask=inside)

    def launch_render(frame, spheres):
        h, w = frame.shape[2:]
        render[(triton.cdiv(h * w, 256),)](frame, spheres, spheres.shape[0], h, w, BLOCK=256)

    def launch_composite(out, colour, frame):
        plane = out.shape[2] * out.shape[3]
        composite[(triton.cdiv(plane, 256),)](out, colour, frame, plane, BLOCK=256)

    return launch_render, launch_composite


class Shader(torch.nn.Module):
    """The network: depth and normals in, colour out (a few convolutions standing in for a learned shader)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(16, 3, 1), torch.nn.Sigmoid())

    def forward(self, frame):
        return self.net(frame)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--size", type=int, default=64, help="frame height and width")
    parser.add_argument("--kernels", choices=("triton", "torch"), default="triton",
                        help="run the renderer and compositor as Triton kernels (interpreted on the CPU) or torch ops")
    parser.add_argument("--frames", type=int, default=3, help="frames to run (the first compiles the kernels)")
    parser.add_argument("--out", default="timeline.json", help="where to write the Perfetto trace")
    args = parser.parse_args(argv)
    if args.kernels == "triton" and not args.device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import stitchml as sm

    render, composite = triton_kernels() if args.kernels == "triton" else (
        lambda frame, spheres: render_torch(frame, spheres[:, :3], spheres[:, 3]), composite_torch)

    # Offline: build the package from the torch module, save it; online: load it.
    torch.manual_seed(0)
    shader = Shader().eval()
    size = args.size
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "shader.smpkg")
        sm.package.from_torch(shader, (torch.zeros(1, 4, size, size),)).save(path)
        fn = sm.load_package(path).function("main")

    dev = sm.device(args.device)
    pipeline = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn, label="shader"))
    heap = dev.new_heap(pipeline.intermediates_heap_size)
    spheres = torch.tensor([[-0.3, -0.2, 2.0, 0.5], [0.35, 0.25, 1.6, 0.4], [0.0, 0.6, 2.6, 0.7]],
                           device=dev.torch_device)
    frame = dev.new_tensor((1, 4, size, size), sm.float32)
    colour = dev.new_tensor((1, 3, size, size), sm.float32)
    image = dev.new_tensor((1, 3, size, size), sm.float32)

    queue = dev.new_command_queue("graphics", timestamps=True)  # GPU times for the trace

    def encode_frame(index: int):
        cb = queue.command_buffer(f"frame{index}")
        with cb.compute_encoder("render") as ce:
            ce.dispatch(render, frame.torch(), spheres, name="render depth+normals")
        cb.barrier(after="dispatch", before="machine_learning")
        ml = cb.ml_encoder("shade")
        ml.set_pipeline(pipeline)
        ml.set_argument_table({"frame": frame, "output": colour})
        ml.dispatch_network(heap)
        ml.end()
        cb.barrier(after="machine_learning", before="dispatch")
        with cb.compute_encoder("composite") as ce:
            ce.dispatch(composite, image.torch(), colour.torch(), frame.torch(), name="composite")
        return cb

    buffers = []
    for index in range(args.frames):  # the first frame compiles the kernels; the trace shows every frame
        cb = encode_frame(index)
        start = time.perf_counter()
        cb.commit()
        cb.wait()
        elapsed = time.perf_counter() - start
        buffers.append(cb)

    with torch.no_grad():
        check = torch.zeros(1, 4, size, size, device=dev.torch_device)
        render_torch(check, spheres[:, :3], spheres[:, 3])
        want = torch.empty(1, 3, size, size, device=dev.torch_device)
        composite_torch(want, shader.to(dev.torch_device)(check), check)
    error = (image.torch() - want).abs().max().item()
    sm.write_trace(args.out, buffers)
    print(f"frame {args.frames - 1} of {size}x{size} on {dev.name} ({args.kernels} kernels): {elapsed * 1e3:.1f} ms, "
          f"heap {pipeline.intermediates_heap_size} bytes, max error against torch {error:.2e}")
    for span in cb.timeline:
        print(f"  {span.kind:<8} {span.name:<40} {span.end_us - span.start_us:10.1f} us")
    print(f"wrote {args.out}")
    return 0 if error < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
