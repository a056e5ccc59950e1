"""The errors a user can cause, one type per place they are found.

Every message says what was expected, what was found and where (the op and
the line of the user's code that built it).
"""
from __future__ import annotations


class StitchError(Exception):
    """Base of every error StitchML raises on purpose."""


class ShapeError(StitchError, ValueError):
    """Operand shapes or types do not fit an operation (raised while building)."""


class FeedError(StitchError, ValueError):
    """A run's feeds do not match the placeholders (raised before any work starts)."""


class GraphError(StitchError, ValueError):
    """The graph is used wrongly: a tensor of another graph, an unknown target, a bad attribute."""


class ExecutionError(StitchError, RuntimeError):
    """An operation failed while running; names the op and where it was built."""


class LayoutError(StitchError, ValueError):
    """A TensorData view does not fit the memory it wraps."""


class SerializationError(StitchError, ValueError):
    """A serialized graph is malformed, truncated or of an unknown version."""


class PackageError(StitchError, ValueError):
    """A network package is malformed, corrupted, hostile or cannot be built or used as asked."""


class PipelineError(StitchError, RuntimeError):
    """A command buffer, encoder, argument table or event is used wrongly (raised before device work)."""


class DataError(StitchError, ValueError):
    """A dataset file is missing, damaged or not in the format it claims (stitchml.data)."""


class DeviceError(StitchError, ValueError):
    """A device name that StitchML does not know, or a device that this machine does not have."""
