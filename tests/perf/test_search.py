"""The analyze search on a model simulated by a formula: which candidates it measures, which it skips."""

from __future__ import annotations

from tritium.analyze.search import Constraints, Point, Trial, Walk
from tritium.analyze.space import Candidate, Space, config_for
from tritium.perf.settings import parse_float_range, parse_int_range


def simulated(concurrency: int, execution_ms: float):
    """A model that takes ``execution_ms`` per execution whatever the batch: measured, exactly."""
    measured = []

    def evaluate(candidate: Candidate) -> Trial:
        measured.append(candidate)
        in_flight = min(concurrency, candidate.instance_count * max(1, candidate.max_batch_size))
        throughput = in_flight * 1000 / execution_ms
        return Trial("m", candidate, {}, (Point(concurrency, throughput, concurrency * 1000 / throughput),))

    return evaluate, measured


def test_the_walk_stops_adding_instances_and_batch_sizes_once_they_bring_nothing():
    evaluate, measured = simulated(concurrency=8, execution_ms=10)
    space = Space(max_instance_count=4, batch_sizes=(1, 2, 4, 8, 16), queue_delays_us=(0,))
    walk = Walk(space, evaluate, Constraints(), "throughput", max_candidates=50)
    walk.run()
    grid = [(c.max_batch_size, c.instance_count) for c in measured if not c.preferred_batch_sizes]
    # batch 1: every instance helps; batch 2 reaches all 8 in flight with 4 instances; batch 4 gets
    # there with 2, a 3rd brings nothing (the 4th is skipped), and the branch as a whole brings
    # nothing over batch 2, so batches 8 and 16 are never tried
    assert grid == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (2, 3), (2, 4), (4, 1), (4, 2), (4, 3)]
    assert len(measured) < space.upper_bound
    best = walk.best()
    assert best.headline(Constraints()).throughput == 800
    assert (best.candidate.max_batch_size, best.candidate.instance_count) == (2, 4)  # the first to reach 800


def test_constraints_rule_out_candidates_and_rank_the_rest():
    evaluate, _ = simulated(concurrency=8, execution_ms=10)
    limits = Constraints(max_p99_ms=5, min_throughput=900)
    walk = Walk(Space(max_instance_count=2, batch_sizes=(1, 2), queue_delays_us=(0,)), evaluate, limits,
                "throughput", max_candidates=10)
    trials = walk.run()
    assert all(t.violations(limits) for t in trials)
    assert walk.best().candidate.instance_count == 2
    assert trials[0].violations(limits) == ["p99 80.0 ms > 5 ms", "100.0 infer/s < 900"]


def test_a_candidate_is_a_complete_config_override():
    base = {"name": "m", "max_batch_size": 4, "instance_group": [{"name": "m_0", "count": 1, "kind": "KIND_GPU",
                                                                 "gpus": [0]}]}
    config = config_for(base, Candidate(3, "KIND_CPU", 16, True, 500, (16,)))
    assert config["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}]
    assert config["max_batch_size"] == 16
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 500, "preferred_batch_size": [16]}
    assert base["max_batch_size"] == 4   # the base is left alone


def test_perf_analyzer_ranges():
    assert parse_int_range("1:8:2") == [1, 3, 5, 7]
    assert parse_int_range("1:64:x4") == [1, 4, 16, 64]
    assert parse_int_range("1,4,9") == [1, 4, 9]
    assert parse_int_range("5") == [5]
    assert parse_float_range("50:100:25") == [50.0, 75.0, 100.0]
