"""Custom metrics in a Python model (``pb_utils.MetricFamily``): Triton's API, its checks and its
error texts (asked of Triton 2.51), and what an instance's heartbeat carries to the broker."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tritium.pb_utils import MODULE_DIR
from tritium.pb_utils.metrics import SERIES
from tritium.pb_utils.types import runtime
from tritium.protocol import Heartbeat, read_record

sys.path.insert(0, MODULE_DIR)
import triton_python_backend_utils as pb_utils  # noqa: E402

COUNTER, GAUGE, HISTOGRAM = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM


@pytest.fixture(autouse=True)
def fresh_instance():
    """Each test an instance of its own: no family or series left from another."""
    runtime.instance_name = "m_0_0"
    _forget_every_series()
    yield
    _forget_every_series()


def _forget_every_series() -> None:
    SERIES.families.clear()
    SERIES.series.clear()
    SERIES.released.clear()


def refused(what: str, message: str) -> str:
    return f"{what}: Failed to process the request for model 'm_0_0', message: {message}"


def test_kinds_are_tritons_enum():
    assert (int(COUNTER), int(GAUGE), int(HISTOGRAM)) == (0, 1, 2)
    assert repr(COUNTER) == "<MetricKind.COUNTER: 0>" and type(COUNTER).__name__ == "MetricKind"
    family = pb_utils.MetricFamily("positional_args", "made with positional arguments", GAUGE)
    assert [n for n in dir(family) if not n.startswith("_")] == ["COUNTER", "GAUGE", "HISTOGRAM", "Metric"]
    assert [n for n in dir(family.Metric()) if not n.startswith("_")] == ["increment", "observe", "set", "value"]


def test_a_counter_a_gauge_and_a_histogram_as_tritons_example_uses_them():
    counter = pb_utils.MetricFamily(name="latency_ns", description="Cumulative time", kind=COUNTER)
    metric = counter.Metric(labels={"model": "m", "version": "1"})
    metric.increment(2)
    metric.increment(np.float32(0.5))
    assert metric.value() == 2.5
    gauges = pb_utils.MetricFamily(name="queue", description="now", kind=GAUGE)
    gauge = gauges.Metric()
    gauge.increment(-2.5)
    assert gauge.value() == -2.5
    gauge.set(7.25)
    gauge.increment(1)
    assert gauge.value() == 8.25
    histograms = pb_utils.MetricFamily(name="sizes", description="each", kind=HISTOGRAM)
    histogram = histograms.Metric(labels={"k": "v"}, buckets=[0.5, 1, 2.5])
    for observed in (0.5, 2, 5):
        histogram.observe(observed)
    assert sorted(SERIES.wire()) == [
        ["latency_ns", "Cumulative time", 0, [[[["model", "m"], ["version", "1"]], [2.5]]]],
        ["queue", "now", 1, [[[], [1, 7.25, 1.0]]]],
        ["sizes", "each", 2, [[[["k", "v"]], [[0.5, 1.0, 2.5], [1, 0, 1, 1], 7.5]]]],
    ]


def test_the_same_name_and_labels_are_one_series_and_the_first_description_stays():
    first = pb_utils.MetricFamily(name="shared", description="first", kind=COUNTER)
    second = pb_utils.MetricFamily(name="shared", description="second", kind=COUNTER)
    a, b = first.Metric(labels={"zeta": "1", "alpha": "2"}), second.Metric(labels={"alpha": "2", "zeta": "1"})
    a.increment(1)
    b.increment(2)
    assert a.value() == b.value() == 3
    assert SERIES.wire() == [["shared", "first", 0, [[[["alpha", "2"], ["zeta", "1"]], [3.0]]]]]
    assert pb_utils.MetricFamily(name="empty", description="no series", kind=GAUGE) is not None
    assert [family[0] for family in SERIES.wire()] == ["shared"]   # a family without series is not reported


@pytest.mark.parametrize("kind, call, message", [
    (COUNTER, lambda m: m.increment(-1), refused(
        "Failed to increment metric value", "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
        "monotonically by non-negative values.")),
    (COUNTER, lambda m: m.set(3), refused("Failed to set metric value",
                                          "TRITONSERVER_METRIC_KIND_COUNTER does not support Set")),
    (COUNTER, lambda m: m.observe(3), refused("Failed to observe metric value",
                                              "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe")),
    (GAUGE, lambda m: m.observe(3), refused("Failed to observe metric value",
                                            "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")),
    (HISTOGRAM, lambda m: m.set(3), refused("Failed to set metric value",
                                            "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set")),
    (HISTOGRAM, lambda m: m.increment(3), refused("Failed to increment metric value",
                                                  "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")),
    (HISTOGRAM, lambda m: m.value(), refused("Failed to get metric value",
                                             "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")),
])
def test_what_a_kind_does_not_support_is_refused_with_tritons_words(kind, call, message):
    family = pb_utils.MetricFamily(name="refusing", description="d", kind=kind)
    metric = family.Metric(buckets=[1.0] if kind == HISTOGRAM else None)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        call(metric)
    assert str(caught.value) == message
    assert metric._series.wire() in ([0.0], [0, None, 0.0], [[1.0], [0, 0], 0.0])   # nothing changed


@pytest.mark.parametrize("kind, labels, buckets, error, message", [
    (GAUGE, [("a", "b")], None, pb_utils.TritonModelException, "Failed to create metric. Labels must be a dictionary."),
    (GAUGE, {"a": 1}, None, pb_utils.TritonModelException,
     refused("Error when creating Metric", "attempt to access JSON non-string as string")),
    (GAUGE, {"a": "b"}, [1.0], pb_utils.TritonModelException, "Failed to create metric. Unexpected buckets found."),
    (HISTOGRAM, {"a": "b"}, None, pb_utils.TritonModelException, "Failed to create metric. Missing required buckets."),
    (HISTOGRAM, {"a": "b"}, (1.0, 2.0), pb_utils.TritonModelException, "Failed to create metric. Buckets must be a list."),
    (HISTOGRAM, {"a": "b"}, [2.0, 1.0], pb_utils.TritonModelException,
     refused("Error when creating Metric", "Bucket Boundaries must be strictly sorted")),
    (HISTOGRAM, {"a": "b"}, ["x"], RuntimeError, "Unable to cast Python instance to C++ type"),
    (GAUGE, {"bad-label": "x"}, None, pb_utils.TritonModelException,
     refused("Error when creating Metric", "Invalid label name 'bad-label'")),
    (GAUGE, {"__reserved": "x"}, None, pb_utils.TritonModelException,
     refused("Error when creating Metric", "Invalid label name '__reserved'")),
])
def test_metrics_that_cannot_be_made_are_refused_with_tritons_words(kind, labels, buckets, error, message):
    family = pb_utils.MetricFamily(name="making", description="d", kind=kind)
    with pytest.raises(error) as caught:
        family.Metric(labels=labels, buckets=buckets)
    assert str(caught.value).startswith(message)
    assert not SERIES.wire()


def test_families_that_cannot_be_made_are_refused():
    for name in ("bad-name", ""):
        with pytest.raises(pb_utils.TritonModelException) as caught:
            pb_utils.MetricFamily(name=name, description="d", kind=GAUGE)
        assert str(caught.value) == refused("Error when creating MetricFamily", "Invalid metric name")
    for args in ((None, "d", GAUGE), ("k", "d", 1), ("k", "d", "COUNTER")):
        with pytest.raises(TypeError, match="incompatible constructor arguments"):
            pb_utils.MetricFamily(*args)
    pb_utils.MetricFamily(name="kinded", description="d", kind=COUNTER)
    with pytest.raises(pb_utils.TritonModelException) as caught:   # Triton's server aborts instead
        pb_utils.MetricFamily(name="kinded", description="d", kind=GAUGE)
    assert str(caught.value) == refused("Error when creating MetricFamily",
                                        "Family name already exists with different type")
    with pytest.raises(TypeError, match="incompatible function arguments"):
        pb_utils.MetricFamily(name="kinded", description="d", kind=COUNTER).Metric().increment("1")


def test_an_empty_list_of_buckets_is_one_bucket_up_to_infinity():
    family = pb_utils.MetricFamily(name="unbounded", description="d", kind=HISTOGRAM)
    metric = family.Metric(buckets=[])
    metric.observe(1e9)
    assert metric._series.wire() == [[], [1], 1e9]


def test_a_series_outlives_its_metric_objects_and_goes_with_its_family_as_in_triton():
    """Triton 2.51 side by side: a Metric made, incremented and dropped in each execute keeps counting."""
    family = pb_utils.MetricFamily(name="per_object", description="d", kind=COUNTER)
    first, second = family.Metric(labels={"k": "v"}), family.Metric(labels={"k": "v"})
    first.increment(2)
    del first, second
    family.Metric(labels={"k": "v"}).increment(3)
    assert SERIES.wire() == [["per_object", "d", 0, [[[["k", "v"]], [5.0]]]]]
    assert family.Metric(labels={"k": "v"}).value() == 5
    twin = pb_utils.MetricFamily(name="per_object", description="d", kind=COUNTER)   # the same family
    twin.Metric(labels={"k": "v"}).increment(1)
    del family
    assert SERIES.wire() == [["per_object", "d", 0, [[[["k", "v"]], [6.0]]]]]   # the twin still holds it
    del twin
    assert SERIES.wire() == []   # none left: the broker forgets what this instance held


def test_labels_and_names_given_as_subclasses_of_str_reach_the_broker_as_str():
    class Text(str):
        pass

    family = pb_utils.MetricFamily(name=Text("subclassed"), description=np.str_("d"), kind=GAUGE)
    metric = family.Metric(labels={"k": np.str_("v"), Text("j"): Text("w")})
    metric.set(1)
    beat = Heartbeat(iid="i", custom_metrics=SERIES.wire()).encode()
    assert read_record(beat)[0].custom_metrics == [["subclassed", "d", 1, [[[["j", "w"], ["k", "v"]], [1, 1.0, 0.0]]]]]


def test_metrics_that_cannot_be_sent_cost_a_heartbeat_its_metrics_not_the_heartbeat(caplog):
    from tritium.workers.instance import HeartbeatThread

    thread = HeartbeatThread("ipc:///nowhere", "m_0_0", 1.0, custom_metrics=lambda: [["m", "d", 0, [[[], [object()]]]]])
    for _ in range(2):
        beat = read_record(thread._beat())[0]
        assert beat.iid == "m_0_0" and beat.joined and beat.custom_metrics is None
    assert caplog.text.count("custom metrics cannot be sent") == 1


def test_a_metric_whose_family_was_deleted_first_is_gone_and_refuses_to_be_used_as_in_triton():
    gone = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
            "object should be deleted AFTER its corresponding 'Metric' objects have been deleted.")
    gauge = pb_utils.MetricFamily(name="orphan", description="d", kind=GAUGE).Metric()   # the family: a temporary
    for call, failed in ((lambda: gauge.set(1), "Failed to set metric value"),
                         (lambda: gauge.increment(1), "Failed to increment metric value"),
                         (gauge.value, "Failed to get metric value")):
        with pytest.raises(pb_utils.TritonModelException) as caught:
            call()
        assert str(caught.value) == f"{failed}: {gone}"
    assert SERIES.wire() == []   # its series left the server with its family


def test_histogram_buckets_must_be_strictly_sorted():
    family = pb_utils.MetricFamily(name="sorted", description="d", kind=HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        family.Metric(buckets=[1, 1, 2, 5, 5])
    assert "Bucket Boundaries must be strictly sorted" in str(caught.value)

