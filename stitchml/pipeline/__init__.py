"""The Metal-4-style runtime: devices, ML pipelines, command queues and buffers, encoders, events, traces.

device.py (devices), resources.py (heaps, shared events), ml.py (ML pipelines and their compiler),
commands.py (queues, command buffers, encoders), trace.py (Chrome/Perfetto traces).

::

    dev = sm.device("cuda"); fn = sm.load_package("net.smpkg").function("main")
    desc = sm.MLPipelineDescriptor(fn); desc.set_input_dimensions("x", (8, 3, 64, 64))
    pipeline = sm.Compiler(dev).new_ml_pipeline(desc)
    heap = dev.new_heap(pipeline.intermediates_heap_size)
    cb = dev.new_command_queue().command_buffer()
    enc = cb.ml_encoder(); enc.set_pipeline(pipeline); enc.set_argument_table({"x": x, "y": y})
    enc.dispatch_network(heap); enc.end(); cb.commit(); cb.wait()

See docs/packages.md ("Running packages").
"""
from .commands import CommandBuffer, CommandQueue, ComputeEncoder, MLEncoder, Span
from .device import Device, device
from .ml import Compiler, MLPipeline, MLPipelineDescriptor
from .resources import Heap, SharedEvent
from .trace import trace_events, write_trace

__all__ = ["device", "Device", "Heap", "SharedEvent", "Compiler", "MLPipeline", "MLPipelineDescriptor",
           "CommandQueue", "CommandBuffer", "MLEncoder", "ComputeEncoder", "Span", "write_trace", "trace_events"]
