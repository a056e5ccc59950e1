"""Fixtures shared by the test modules."""
from __future__ import annotations

import pytest


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
