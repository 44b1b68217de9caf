"""What tritium analyze leaves behind: an HTML report with embedded plots, config.pbtxt files,
and a summary table on the terminal."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from tritium.analyze.search import Constraints, Point, Trial, ranking_key


@dataclass(frozen=True)
class Outcome:
    model: str                       # the model measured (an ensemble, or the model itself)
    trials: tuple[Trial, ...]
    best: dict[str, Trial]           # per varied model: its best trial
    limits: Constraints
    objective: str
    concurrencies: tuple[int, ...]


def _headlines(trials: list[Trial], limits: Constraints) -> list[tuple[Trial, Point]]:
    """Each measured trial with its headline point; failed and unmeasured trials have none."""
    measured = []
    for trial in trials:
        point = trial.headline(limits)
        if not trial.error and point is not None:
            measured.append((trial, point))
    return measured


def pareto_front(trials: list[Trial], limits: Constraints) -> list[tuple[Trial, Point]]:
    """Candidates no other candidate beats on both throughput and p99 (at their headline points),
    each with that point, lowest p99 first."""
    measured = _headlines(trials, limits)
    front = [(t, p) for t, p in measured
             if not any(q.throughput >= p.throughput and q.p99_ms <= p.p99_ms and
                        (q.throughput > p.throughput or q.p99_ms < p.p99_ms) for _, q in measured)]
    return sorted(front, key=lambda pair: pair[1].p99_ms)


def summary_figure(outcome: Outcome) -> bytes:
    """One PNG: throughput against p99 per candidate with the Pareto front, memory and CPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = [t for t in outcome.trials if not t.error and t.points]
    figure, (curve, memory, cpu) = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [2, 1, 1]})
    for index, trial in enumerate(trials):
        curve.plot([p.p99_ms for p in trial.points], [p.throughput for p in trial.points], marker="o",
                   markersize=5, linewidth=1, alpha=0.6, label=f"#{index + 1} {trial.candidate.label}")
    front = pareto_front(trials, outcome.limits)
    curve.plot([p.p99_ms for _, p in front], [p.throughput for _, p in front],
               color="black", linewidth=2, marker="o", markersize=11, markerfacecolor="none",
               label="Pareto front")
    if outcome.limits.max_p99_ms is not None:
        curve.axvline(outcome.limits.max_p99_ms, color="red", linestyle="--", label="p99 budget")
    if outcome.limits.min_throughput is not None:
        curve.axhline(outcome.limits.min_throughput, color="orange", linestyle="--", label="min throughput")
    curve.set_xlabel("p99 latency (ms)")
    curve.set_ylabel("throughput (infer/s)")
    curve.set_title(f"{outcome.model}: every candidate at concurrency {', '.join(map(str, outcome.concurrencies))}")
    curve.grid(alpha=0.3)
    curve.legend(fontsize=7, loc="best")
    names = [f"#{i + 1}" for i in range(len(trials))]
    best = set(id(t) for t in outcome.best.values())
    colors = ["tab:green" if id(t) in best else "tab:blue" for t in trials]
    memory.bar(names, [t.memory_mb or 0 for t in trials], color=colors)
    memory.set_title("resident memory of the instances (MB)")
    cpu.bar(names, [t.cpu_percent or 0 for t in trials], color=colors)
    cpu.set_title("CPU of the instances while measured (%)")
    for axis in (memory, cpu):
        axis.tick_params(axis="x", labelsize=7, rotation=90)
        axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


def _cell(value) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def html_report(outcome: Outcome, figure_png: bytes, configs: dict[str, str]) -> str:
    rows = []
    ranked = sorted(enumerate(outcome.trials), key=lambda it: ranking_key(it[1], outcome.limits, outcome.objective),
                    reverse=True)
    plotted = [t for t in outcome.trials if not t.error and t.points]
    for _, trial in ranked:
        number = f"#{plotted.index(trial) + 1}" if trial in plotted else "-"
        points = "; ".join(f"c{p.concurrency}: {p.throughput:.1f}/s p99 {p.p99_ms:.1f} ms" for p in trial.points)
        problems = trial.violations(outcome.limits)
        status = "best" if trial in outcome.best.values() else ("meets constraints" if not problems else
                                                                 "; ".join(problems))
        rows.append("<tr>" + "".join(_cell(v) for v in (
            number, trial.model, trial.candidate.label, points,
            "" if trial.memory_mb is None else f"{trial.memory_mb:.0f}",
            "" if trial.cpu_percent is None else f"{trial.cpu_percent:.0f}", status)) + "</tr>")
    limits = outcome.limits
    constraints = []
    if limits.max_p99_ms is not None:
        constraints.append(f"p99 &le; {limits.max_p99_ms:g} ms")
    if limits.min_throughput is not None:
        constraints.append(f"throughput &ge; {limits.min_throughput:g} infer/s")
    if limits.max_memory_mb is not None:
        constraints.append(f"memory &le; {limits.max_memory_mb:g} MB")
    constraint_text = ", ".join(constraints) or "none"
    best_blocks = "".join(
        f"<h3>{html.escape(name)}: {html.escape(trial.candidate.label)}</h3><pre>{html.escape(configs[name])}</pre>"
        for name, trial in outcome.best.items())
    image = base64.b64encode(figure_png).decode()
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tritium analyze: {html.escape(outcome.model)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}} pre{{background:#f4f4f4;padding:1em}}</style>
</head><body>
<h1>tritium analyze: {html.escape(outcome.model)}</h1>
<p>Objective: {html.escape(outcome.objective)}. Constraints: {constraint_text}.
Concurrency: {", ".join(map(str, outcome.concurrencies))}. Candidates measured: {len(outcome.trials)}.</p>
<img alt="throughput against p99 latency, memory and CPU per candidate" src="data:image/png;base64,{image}">
<h2>Best configuration</h2>{best_blocks or "<p>No candidate met the constraints.</p>"}
<h2>Every candidate</h2>
<table><tr><th>plot</th><th>model</th><th>candidate</th><th>measured</th><th>memory MB</th><th>CPU %</th>
<th>status</th></tr>{"".join(rows)}</table>
</body></html>
"""


def write_outputs(outcome: Outcome, output: Path, configs: dict[str, str]) -> Path:
    output.mkdir(parents=True, exist_ok=True)
    figure = summary_figure(outcome)
    (output / "summary.png").write_bytes(figure)
    for name, text in configs.items():
        (output / name).mkdir(exist_ok=True)
        (output / name / "config.pbtxt").write_text(text)
    report = output / "report.html"
    report.write_text(html_report(outcome, figure, configs))
    return report


def summary_table(outcome: Outcome):
    """A rich Table of every candidate, best first."""
    from rich.table import Table

    table = Table(title=f"tritium analyze: {outcome.model}")
    for column in ("model", "candidate", "infer/s", "p99 ms", "memory MB", "CPU %", "status"):
        table.add_column(column, justify="right" if column in ("infer/s", "p99 ms", "memory MB", "CPU %") else "left")
    for trial in sorted(outcome.trials, key=lambda t: ranking_key(t, outcome.limits, outcome.objective),
                        reverse=True):
        point = trial.headline(outcome.limits)
        problems = trial.violations(outcome.limits)
        status = "best" if trial in outcome.best.values() else ("ok" if not problems else "; ".join(problems))
        table.add_row(trial.model, trial.candidate.label, f"{point.throughput:.1f}" if point else "-",
                      f"{point.p99_ms:.1f}" if point else "-",
                      "-" if trial.memory_mb is None else f"{trial.memory_mb:.0f}",
                      "-" if trial.cpu_percent is None else f"{trial.cpu_percent:.0f}", status)
    return table
