"""Which candidates to measure, and when to stop: a walk that abandons a branch once it stops paying.

The walk grows max_batch_size in powers of two; for each size it adds instances one at a
time and stops adding once an instance brings no gain. It stops growing the batch size
once a size brings no gain over the best so far. Around the best setting it then tries
queue delays and preferred batch sizes, and the other instance kind where GPUs exist.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tritium.analyze.space import Candidate, Space

GAIN = 0.05      # below 5% better on both throughput and p99, a change counts as no gain
NOT_MEASURED = "no load level was measured"


@dataclass(frozen=True)
class Constraints:
    max_p99_ms: float | None = None
    min_throughput: float | None = None
    max_memory_mb: float | None = None


@dataclass(frozen=True)
class Point:
    concurrency: int
    throughput: float
    p99_ms: float


@dataclass(frozen=True)
class Trial:
    """One candidate, measured (or failed) while ``model`` carried its settings."""

    model: str
    candidate: Candidate
    config: dict
    points: tuple[Point, ...] = ()
    memory_mb: float | None = None
    cpu_percent: float | None = None
    error: str = ""

    def headline(self, limits: Constraints) -> Point | None:
        """The point that speaks for the candidate: the fastest within the latency budget."""
        if not self.points:
            return None
        within = [p for p in self.points if limits.max_p99_ms is None or p.p99_ms <= limits.max_p99_ms]
        if within:
            return max(within, key=lambda p: (p.throughput, -p.p99_ms))
        return min(self.points, key=lambda p: p.p99_ms)

    def violations(self, limits: Constraints) -> list[str]:
        if self.error:
            return [self.error]
        point = self.headline(limits)
        if point is None:   # no error, yet no figures: nothing shows that it meets the constraints
            return [NOT_MEASURED]
        problems = []
        if limits.max_p99_ms is not None and point.p99_ms > limits.max_p99_ms:
            problems.append(f"p99 {point.p99_ms:.1f} ms > {limits.max_p99_ms:g} ms")
        if limits.min_throughput is not None and point.throughput < limits.min_throughput:
            problems.append(f"{point.throughput:.1f} infer/s < {limits.min_throughput:g}")
        if limits.max_memory_mb is not None and self.memory_mb is not None and self.memory_mb > limits.max_memory_mb:
            problems.append(f"memory {self.memory_mb:.0f} MB > {limits.max_memory_mb:g} MB")
        return problems


def ranking_key(trial: Trial, limits: Constraints, objective: str):
    """Feasible before infeasible, then the objective: throughput (default) or p99 latency."""
    point = trial.headline(limits)
    if point is None:
        return (False, float("-inf"), float("-inf"))
    feasible = not trial.violations(limits)
    if objective == "latency":
        return (feasible, -point.p99_ms, point.throughput)
    return (feasible, point.throughput, -point.p99_ms)


def gains(new: Trial, old: Trial | None, limits: Constraints) -> bool:
    if old is None:
        return not new.error
    a, b = new.headline(limits), old.headline(limits)
    if a is None:
        return False
    if b is None:
        return True
    return a.throughput > b.throughput * (1 + GAIN) or a.p99_ms < b.p99_ms * (1 - GAIN)


Evaluate = Callable[[Candidate], Trial]


class Walk:
    """Runs the search for one model; ``planned`` shrinks as branches are cut."""

    def __init__(self, space: Space, evaluate: Evaluate, limits: Constraints, objective: str,
                 max_candidates: int, on_plan: Callable[[int], None] = lambda _: None) -> None:
        self.space = space
        self.evaluate = evaluate
        self.limits = limits
        self.objective = objective
        self.max_candidates = max_candidates
        self.on_plan = on_plan
        self.trials: list[Trial] = []
        self.planned = min(space.upper_bound, max_candidates)

    def _try(self, candidate: Candidate) -> Trial | None:
        if len(self.trials) >= self.max_candidates:
            return None
        known = next((t for t in self.trials if t.candidate == candidate), None)
        if known:
            return known
        trial = self.evaluate(candidate)
        self.trials.append(trial)
        return trial

    def _cut(self, skipped: int) -> None:
        self.planned = max(len(self.trials), self.planned - skipped)
        self.on_plan(self.planned)

    def _better(self, a: Trial | None, b: Trial | None) -> Trial | None:
        if a is None or b is None:
            return a or b
        return self._higher(a, b)

    def _higher(self, a: Trial, b: Trial) -> Trial:
        return a if ranking_key(a, self.limits, self.objective) >= ranking_key(b, self.limits, self.objective) else b

    def run(self) -> list[Trial]:
        best = self._grid()
        if best is not None:
            best = self._refine(best)
            self._other_kinds(best)
        return self.trials

    def _grid(self) -> Trial | None:
        best = None
        sizes = self.space.batch_sizes
        for position, size in enumerate(sizes):
            branch = None
            for count in range(1, self.space.max_instance_count + 1):
                trial = self._try(self.space.first(size, count))
                if trial is None:
                    return best
                if not gains(trial, branch, self.limits):
                    self._cut(self.space.max_instance_count - count)
                    break
                branch = self._better(trial, branch)
            if branch is None or (best is not None and not gains(branch, best, self.limits)):
                self._cut((len(sizes) - position - 1) * self.space.max_instance_count)
                return self._better(best, branch)
            best = self._better(branch, best)
        return best

    def _refine(self, best: Trial) -> Trial:
        start = best.candidate
        if not start.dynamic_batching:
            return best
        for delay in self.space.queue_delays_us:
            if delay == start.max_queue_delay_us:
                continue
            trial = self._try(replace(start, max_queue_delay_us=delay))
            if trial is None:
                return best
            if gains(trial, best, self.limits):
                best = self._higher(trial, best)
            elif delay > start.max_queue_delay_us:
                break    # longer delays than one that did not help will not help either
        preferred = self._try(replace(best.candidate, preferred_batch_sizes=(best.candidate.max_batch_size,)))
        return best if preferred is None or not gains(preferred, best, self.limits) else self._higher(preferred, best)

    def _other_kinds(self, best: Trial) -> None:
        for kind in self.space.kinds:
            if kind != best.candidate.kind:
                self._try(replace(best.candidate, kind=kind))

    def best(self) -> Trial | None:
        return best_trial(self.trials, self.limits, self.objective)


def best_trial(trials: list[Trial], limits: Constraints, objective: str) -> Trial | None:
    """The top trial, or the first one measured that it does not clearly beat (noise is no reason
    to prefer a more elaborate setting)."""
    measured = [t for t in trials if not t.error]
    if not measured:
        return None
    top = max(measured, key=lambda t: ranking_key(t, limits, objective))
    feasible = not top.violations(limits)
    return next(t for t in measured
                if t is top or (not gains(top, t, limits) and feasible == (not t.violations(limits))))
