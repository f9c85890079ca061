"""The shared bounds of ktframe.core.limits: what each refuses, in one line naming the value."""

from __future__ import annotations

import pytest

from ktframe.core import limits
from ktframe.core.errors import InputError


@pytest.mark.parametrize("value", [-1, 2**32, 2**70, 1e9, True, "3", None])
def test_a_seed_outside_numpys_range_or_not_an_integer_is_refused_naming_it(value):
    with pytest.raises(InputError) as caught:
        limits.check_seed(value, "trainer.seed")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("trainer.seed must be an integer from 0 to 4294967295")


@pytest.mark.parametrize("value", [0, 7, 2**32 - 1])
def test_a_seed_within_range_is_returned_as_an_int(value):
    assert limits.check_seed(value, "s") == value and type(limits.check_seed(value, "s")) is int


def test_iterations_beyond_the_bound_are_refused():
    assert limits.check_iterations(limits.MAX_ITERATIONS, "max_iter") == limits.MAX_ITERATIONS
    with pytest.raises(InputError, match=r"max_iter must be an integer from 1 to 1000000; got 1000000000"):
        limits.check_iterations(10**9, "max_iter", minimum=1)


def test_available_memory_is_positive_and_an_allocation_beyond_it_is_refused_with_both_sizes():
    available = limits.available_memory()
    assert 0 < available
    limits.check_allocation(1024, "a kibibyte")
    with pytest.raises(InputError, match=r"^data.batch_size=1e9 needs about .* of memory; expected at most the .* this machine has available$"):
        limits.check_allocation(available * 2 + 1, "data.batch_size=1e9")


def test_sizes_are_written_in_binary_units():
    assert limits.size_text(512) == "512 B"
    assert limits.size_text(1536) == "1.5 KiB"
    assert limits.size_text(3 * 2**30) == "3 GiB"
