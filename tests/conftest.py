import os

import pytest

from ktframe.kernels import jit

KTFRAME_MIN_NUMBERS = jit.MIN_NUMBERS  # ktframe's size rule, before a test changes it

# A plugin that fails to load is an error in the test suite, not a warning.
os.environ.setdefault("KTFRAME_STRICT_PLUGINS", "1")


@pytest.fixture(autouse=True)
def kernels_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process the kernels serve problems of every size, so that the tests of the kernels
    and of the fast path, whose problems are small, run the kernels. A ktframe process that a test
    starts keeps ktframe's rule (``ktframe.kernels.jit.MIN_NUMBERS``), which
    ``tests/test_first_hour.py`` tests."""
    monkeypatch.setattr(jit, "MIN_NUMBERS", 0)


@pytest.fixture
def kernels_by_ktframe_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """ktframe's own size rule in this process too, for a test that compares what it computes here
    with what a ktframe process computes (kernels and PyTorch's operations round differently)."""
    monkeypatch.setattr(jit, "MIN_NUMBERS", KTFRAME_MIN_NUMBERS)
