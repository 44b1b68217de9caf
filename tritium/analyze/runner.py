"""One analysis: for each model to tune, walk its space, loading and measuring each candidate.

For an ensemble, each composing model is tuned in turn while the ensemble is measured end
to end; a composing model keeps its best setting while the next one is tuned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

from tritium.analyze import resources
from tritium.analyze.control import ModelControl
from tritium.analyze.search import Constraints, Point, Trial, Walk
from tritium.analyze.space import Candidate, Space, config_for
from tritium.perf.errors import PerfError
from tritium.perf.settings import LoadLevel, PerfSettings
from tritium.perf.sweep import run_sweep


@dataclass(frozen=True)
class SearchBounds:
    max_instance_count: int = 4
    max_batch_size: int = 64
    queue_delays_us: tuple[int, ...] = (0, 100, 1000)
    max_candidates: int = 24
    gpus: bool = False


class Analysis:
    def __init__(self, control: ModelControl, perf: PerfSettings, bounds: SearchBounds, limits: Constraints,
                 objective: str, on_trial: Callable[[Trial], None], on_plan: Callable[[int], None]) -> None:
        self.control = control
        self.perf = perf
        self.bounds = bounds
        self.limits = limits
        self.objective = objective
        self.on_trial = on_trial
        self.on_plan = on_plan

    def tuned_models(self, config: dict) -> list[str]:
        if config.get("platform") == "ensemble":
            steps = config.get("ensemble_scheduling", {}).get("step", [])
            return list(dict.fromkeys(step["model_name"] for step in steps))
        return [self.perf.model]

    def space(self, config: dict) -> Space:
        return Space.of(config, self.bounds.max_instance_count, self.bounds.max_batch_size,
                        self.bounds.queue_delays_us, self.bounds.gpus)

    def planned(self, models: list[str]) -> int:
        return sum(min(self.space(self.control.config(m)).upper_bound, self.bounds.max_candidates) for m in models)

    def run(self, measured_config: dict) -> tuple[list[Trial], dict[str, Trial]]:
        """Tune the models behind ``measured_config`` (from ModelControl.check)."""
        models = self.tuned_models(measured_config)
        trials: list[Trial] = []
        best: dict[str, Trial] = {}
        total = self.planned(models)
        self.on_plan(total)
        for model in models:
            base = self.control.config(model)
            plan_before = min(self.space(base).upper_bound, self.bounds.max_candidates)
            walk = Walk(self.space(base), partial(self.evaluate, model, base, models=models),
                        self.limits, self.objective, self.bounds.max_candidates,
                        partial(self._replan, total - plan_before))
            trials += walk.run()
            total = total - plan_before + walk.planned
            chosen = walk.best()
            if chosen is not None:
                best[model] = chosen
                self.control.load(model, chosen.config)   # the next model is tuned around this one
        for model in models:
            self.control.load(model)   # leave the server as the repository has it
        return trials, best

    def _replan(self, planned_elsewhere: int, planned_here: int) -> None:
        self.on_plan(planned_elsewhere + planned_here)

    def evaluate(self, model: str, base: dict, candidate: Candidate, models: list[str]) -> Trial:
        config = config_for(base, candidate)
        problem = self.control.load(model, config)
        if problem:
            trial = Trial(model, candidate, config, error=f"load failed: {problem}")
            self.on_trial(trial)
            return trial
        before = resources.usage(models)
        started = time.monotonic()
        try:
            reports = run_sweep(self.perf)
        except PerfError as exc:
            trial = Trial(model, candidate, config, error=exc.message)
            self.on_trial(trial)
            return trial
        elapsed = time.monotonic() - started
        after = resources.usage(models)
        points = tuple(Point(r.concurrency, r.inferences_per_s, r.p99_us / 1000) for r in reports)
        # no instance processes here: a server on another host, whose usage this cannot see
        memory = sum(p.memory_mb for p in after.values()) if after else None
        cpu = resources.cpu_percent(before, after, elapsed) if after else None
        trial = Trial(model, candidate, config, points, memory, cpu)
        self.on_trial(trial)
        return trial


def perf_settings(model: str, url: str, protocol: str, concurrencies: list[int], interval_ms: float,
                  max_trials: int, stability_percent: float, batch_size: int,
                  shapes: dict[str, list[int]]) -> PerfSettings:
    """Short windows, and an unstable level is kept rather than fatal: a search wants a figure."""
    from tritium.perf.settings import Measurement

    measurement = Measurement(interval_ms=interval_ms, max_trials=max_trials, stability_percent=stability_percent,
                              require_stable=False)
    return PerfSettings(model=model, url=url, protocol=protocol, batch_size=batch_size, shapes=shapes,
                        levels=tuple(LoadLevel(concurrency=c) for c in concurrencies), measurement=measurement)

