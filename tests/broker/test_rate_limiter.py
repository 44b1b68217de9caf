"""The rate limiter's counts (``--rate-limit=execution_count``): the limits each resource gets,
Triton's load errors, and the flag's format."""

from __future__ import annotations

import logging

import pytest

from tritium.broker.rate_limiter import EVERY_DEVICE, RateLimiter, ResourceFlag
from tritium.broker.registry import InstanceRecord
from tritium.errors import InvalidArgument


def instance(name: str, device: int = 0) -> InstanceRecord:
    return InstanceRecord(name.encode(), b"agent", "m", 1, name, 1, device=device)


def running_together(limiter: RateLimiter, *instances: InstanceRecord) -> bool:
    """Whether all of ``instances`` can hold their resources at once (each acquired in turn)."""
    started = []
    try:
        for each in instances:
            if not limiter.free(each):
                return False
            limiter.acquire(each)
            started.append(each)
        return True
    finally:
        for each in started:
            limiter.release(each)


def test_without_counts_given_each_resource_has_the_most_any_instance_asks_for():
    limiter = RateLimiter()
    big, small_a, small_b = instance("big"), instance("small_a"), instance("small_b")
    limiter.register(big, [("R", False, 2)], 1)
    limiter.register(small_a, [("R", False, 1)], 1)
    limiter.register(small_b, [("R", False, 1)], 1)
    assert running_together(limiter, small_a, small_b)
    assert not running_together(limiter, big, small_a)
    assert running_together(limiter, big)


def test_the_limit_shrinks_when_the_instance_that_asked_most_is_gone():
    limiter = RateLimiter()
    big, small_a, small_b = instance("big"), instance("small_a"), instance("small_b")
    for each, count in ((big, 2), (small_a, 1), (small_b, 1)):
        limiter.register(each, [("R", False, count)], 1)
    limiter.forget(big)
    assert not running_together(limiter, small_a, small_b)


def test_the_verbose_log_shows_the_counts_as_triton_does_as_instances_come_and_go(caplog):
    limiter = RateLimiter()
    four, three = instance("four"), instance("three", device=1)
    with caplog.at_level(logging.DEBUG, logger="tritium.broker.rate_limiter"):
        limiter.register(four, [("R1", False, 4), ("G", True, 2)], 1)
        limiter.register(three, [("R1", False, 3)], 1)
        limiter.forget(four)
    assert [r.getMessage() for r in caplog.records] == [
        r"\nMax Resource Map===>\n\tDevice: GLOBAL\n\t\tResource: G\t Count: 2\n"
        r"\tDevice: 0\n\t\tResource: R1\t Count: 4\n",
        r"\nMax Resource Map===>\n\tDevice: GLOBAL\n\t\tResource: G\t Count: 2\n"
        r"\tDevice: 0\n\t\tResource: R1\t Count: 4\n\tDevice: 1\n\t\tResource: R1\t Count: 3\n",
        r"\nMax Resource Map===>\n\tDevice: 1\n\t\tResource: R1\t Count: 3\n"]


def test_the_verbose_log_names_the_host_when_several_have_counts(caplog):
    first, second = instance("a"), InstanceRecord(b"b", b"other", "m", 1, "b", 1)
    limiter = RateLimiter()
    with caplog.at_level(logging.DEBUG, logger="tritium.broker.rate_limiter"):
        limiter.register(first, [("R1", False, 4)], 1)
        limiter.register(second, [("R1", False, 2)], 1)
    assert caplog.records[-1].getMessage() == (
        r"\nMax Resource Map===>\n\tDevice: 0 of host agent\n\t\tResource: R1\t Count: 4\n"
        r"\tDevice: 0 of host other\n\t\tResource: R1\t Count: 2\n")


def test_a_resource_counts_per_device_unless_global():
    limiter = RateLimiter()
    on_0, on_1 = instance("a", device=0), instance("b", device=1)
    limiter.register(on_0, [("R", False, 1)], 1)
    limiter.register(on_1, [("R", False, 1)], 1)
    assert running_together(limiter, on_0, on_1)
    shared = RateLimiter()
    on_0, on_1 = instance("a", device=0), instance("b", device=1)
    shared.register(on_0, [("G", True, 1)], 1)
    shared.register(on_1, [("G", True, 1)], 1)
    assert not running_together(shared, on_0, on_1)


def test_a_count_given_below_what_an_instance_needs_refuses_it_with_tritons_text():
    limiter = RateLimiter([ResourceFlag("R", 1)])
    with pytest.raises(InvalidArgument) as refused:
        limiter.register(instance("greedy"), [("R", False, 2)], 1)
    assert refused.value.message == ('Resource count for "R" is limited to 1 which will prevent scheduling of one '
                                     "or more model instances, the minimum required count is 2")
    fits = instance("fits")
    limiter.register(fits, [("R", False, 1)], 1)   # the refused one left nothing behind
    assert running_together(limiter, fits)


def test_a_resource_the_flags_do_not_name_is_limited_to_zero():
    limiter = RateLimiter([ResourceFlag("R", 4)])
    with pytest.raises(InvalidArgument, match='Resource count for "S" is limited to 0 .* required count is 1$'):
        limiter.register(instance("x"), [("S", False, 1)], 1)


def test_counts_given_for_a_device_and_for_every_device_take_the_larger_and_a_repeat_the_smaller():
    limiter = RateLimiter([ResourceFlag("R", 1, 0), ResourceFlag("R", 3), ResourceFlag("R", 2), ResourceFlag("S", 1, 1)])
    a, b = instance("a"), instance("b")
    limiter.register(a, [("R", False, 1)], 1)
    limiter.register(b, [("R", False, 1)], 1)
    assert running_together(limiter, a, b)   # R on device 0: max(1, min(3, 2)) = 2
    with pytest.raises(InvalidArgument, match='"S" is limited to 0'):   # S is given for device 1 only
        limiter.register(instance("c", device=0), [("S", False, 1)], 1)
    limiter.register(instance("d", device=1), [("S", False, 1)], 1)


def test_a_global_resource_takes_the_largest_count_given_for_its_name_on_any_device():
    limiter = RateLimiter([ResourceFlag("G", 1, 0), ResourceFlag("G", 2, 3)])
    a, b = instance("a"), instance("b", device=5)
    limiter.register(a, [("G", True, 1)], 1)
    limiter.register(b, [("G", True, 1)], 1)
    assert running_together(limiter, a, b)


def test_a_name_both_global_and_per_device_is_refused():
    limiter = RateLimiter()
    limiter.register(instance("a"), [("R", True, 1)], 1)
    with pytest.raises(InvalidArgument) as refused:
        limiter.register(instance("b"), [("R", False, 1)], 1)
    assert refused.value.message == ('Resource "R" is present as both global and device-specific resource in the '
                                     "model configuration.")


def test_rank_is_executions_times_priority_with_zero_taken_as_one():
    limiter = RateLimiter()
    zero, two = instance("zero"), instance("two")
    limiter.register(zero, [], 0)
    limiter.register(two, [], 2)
    for _ in range(3):
        for each in (zero, two):
            limiter.acquire(each)
            limiter.release(each)
    assert (limiter.rank(zero), limiter.rank(two)) == (3, 6)


@pytest.mark.parametrize("text, flag", [
    ("R:2", ResourceFlag("R", 2, EVERY_DEVICE)),
    ("R:2:1", ResourceFlag("R", 2, 1)),
    ("Mixed_Case:0", ResourceFlag("Mixed_Case", 0, EVERY_DEVICE)),
])
def test_the_flag_reads_name_count_and_an_optional_device(text, flag):
    assert ResourceFlag.parse(text) == flag


@pytest.mark.parametrize("text", ["R", "R:2:1:0", ""])
def test_a_malformed_flag_gets_tritons_format_error(text):
    with pytest.raises(ValueError) as refused:
        ResourceFlag.parse(text)
    assert str(refused.value) == ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' "
                                  f"or '<resource_name>:<count>'. Got {text}")


@pytest.mark.parametrize("text, value", [("R:x", "x"), ("R:2:gpu", "gpu"), ("R:5:", ""), ("R:5_0", "5_0")])
def test_a_count_or_device_that_is_no_integer_gets_tritons_value_error(text, value):
    with pytest.raises(ValueError) as refused:
        ResourceFlag.parse(text)
    assert str(refused.value) == f"Invalid option value. Got {value}"


def test_the_count_check_comes_before_the_global_check_and_global_resources_first():
    limiter = RateLimiter([ResourceFlag("R", 1), ResourceFlag("A", 1)])
    limiter.register(instance("a"), [("R", True, 1)], 1)
    with pytest.raises(InvalidArgument, match='"R" is limited to 1 .* required count is 2$'):
        limiter.register(instance("b"), [("R", False, 2)], 1)
    with pytest.raises(InvalidArgument, match='"A" is limited to 1 .* required count is 3$'):
        limiter.register(instance("c"), [("R", False, 2), ("A", True, 3)], 1)


def test_each_host_has_its_own_devices_and_global_resources():
    limiter = RateLimiter([ResourceFlag("R", 1)])
    here, there = instance("here"), InstanceRecord(b"there", b"agent-2", "m", 1, "there", 1)
    limiter.register(here, [("R", False, 1)], 1)
    limiter.register(there, [("R", False, 1)], 1)
    assert running_together(limiter, here, there)
