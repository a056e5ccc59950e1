"""Fixtures shared by the test modules."""
from __future__ import annotations

import pytest

# Triton decorates its own library (tl.sum's combine functions, ...) when it is first imported, for the
# interpreter or not as TRITON_INTERPRET says then. Import it now, under the run's setting, so that a test
# that unsets the variable for the native CPU backend cannot be the first import and leave the
# interpreter's later kernels calling compiled-mode helpers.
try:
    import triton.language  # noqa: F401
except ImportError:  # the tests that need Triton say so themselves
    pass


@pytest.fixture(scope="module")
def triton_interpreter(tmp_path_factory):
    """Generated kernels run on the CPU under Triton's interpreter, cached in a directory of their own.

    `.ci/run` exports TRITON_INTERPRET=1 for the whole run; the fixture makes a module run alone behave
    the same, and keeps the kernel files these tests write out of the user's cache.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv("STITCHML_CACHE_DIR", str(tmp_path_factory.mktemp("stitchml-cache")))
        yield
