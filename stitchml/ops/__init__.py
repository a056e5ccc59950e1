"""All primitives, one module per family; importing this package registers them."""
from . import elementwise, state, reduction, movement, indexing, contraction, random, fusion  # noqa: F401
from . import shape, image, scan, collective, control  # noqa: F401
from .contraction import Convolution2DDescriptor, Pooling2DDescriptor  # noqa: F401
