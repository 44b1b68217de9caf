"""A picture of the dashboard's panels, drawn with matplotlib from a real server's metrics.

Grafana is not needed: this starts ``tritium serve`` on the demo repository, runs a short
load in phases (steady traffic with a few failures and cache hits, then a burst that
wakes the autoscaled model from zero and grows it, then quiet while it scales back),
scrapes /metrics every second, evaluates each panel's PromQL over those scrapes (the
subset the dashboard uses: selectors, rate/increase, sum/max by, arithmetic) and lays the
panels out on the dashboard's grid.

    python -m deploy.grafana.preview docs/images/grafana-dashboard.png
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import promql_parser
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import TritiumServer

GRAFANA = Path(__file__).resolve().parent
SCRAPE_EVERY_S = 1.0
RATE_WINDOW = "4s"        # Grafana's $__rate_interval for a 1 s scrape interval: four scrapes
SAMPLE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')
Labels = frozenset   # of (name, value) pairs


@dataclass
class Scrapes:
    """Every scrape: its time and its samples by (metric name, labels)."""

    times: list[float] = field(default_factory=list)
    samples: list[dict[tuple[str, Labels], float]] = field(default_factory=list)

    def take(self, url: str) -> None:
        self.add(time.monotonic(), urllib.request.urlopen(url, timeout=5).read().decode())

    def add(self, at: float, text: str) -> None:
        found = {}
        for line in text.splitlines():
            match = SAMPLE.match(line)
            if match:
                labels = Labels(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
                found[(match.group(1), labels)] = float(match.group(3))
        self.times.append(at)
        self.samples.append(found)


# -- PromQL over the scrapes ---------------------------------------------------------------------

def evaluate(node, scrapes: Scrapes, at: int) -> dict[Labels, float] | float:
    """The value of an expression at scrape ``at``: a vector (labels -> value) or a scalar."""
    if isinstance(node, promql_parser.NumberLiteral):
        return node.val
    if isinstance(node, promql_parser.ParenExpr):
        return evaluate(node.expr, scrapes, at)
    if isinstance(node, promql_parser.VectorSelector):
        return {labels: v for (name, labels), v in scrapes.samples[at].items() if _selected(node, name, labels)}
    if isinstance(node, promql_parser.Call):
        return _range_function(node, scrapes, at)
    if isinstance(node, promql_parser.AggregateExpr):
        return _aggregate(node, evaluate(node.expr, scrapes, at))
    if isinstance(node, promql_parser.BinaryExpr):
        return _arithmetic(str(node.op), evaluate(node.lhs, scrapes, at), evaluate(node.rhs, scrapes, at))
    raise ValueError(f"the preview does not evaluate {type(node).__name__}: {node}")


def _selected(selector, name: str, labels: Labels) -> bool:
    if name != selector.name:
        return False
    values = dict(labels)
    for matcher in selector.matchers.matchers:
        value, op = values.get(matcher.name, ""), str(matcher.op).rsplit(".", 1)[-1]
        matched = value == matcher.value if op in ("Equal", "NotEqual") else re.fullmatch(matcher.value, value)
        if bool(matched) == op.startswith("Not"):
            return False
    return True


def _range_function(call, scrapes: Scrapes, at: int) -> dict[Labels, float]:
    """rate() and increase(): a counter's growth over the window ending at scrape ``at``."""
    matrix = call.args[0]
    window = matrix.range.total_seconds()
    inside = [i for i in range(at + 1) if scrapes.times[at] - scrapes.times[i] <= window]
    first, last = inside[0], inside[-1]
    if first == last:
        return {}
    span = scrapes.times[last] - scrapes.times[first]
    start = evaluate(matrix.vector_selector, scrapes, first)
    end = evaluate(matrix.vector_selector, scrapes, last)
    growth = {labels: end[labels] - start[labels] for labels in end if labels in start}
    if call.func.name == "rate":
        return {labels: g / span for labels, g in growth.items()}
    if call.func.name == "increase":
        return growth
    raise ValueError(f"the preview does not evaluate {call.func.name}()")


def _aggregate(node, vector: dict[Labels, float]) -> dict[Labels, float]:
    kept = set(node.modifier.labels) if node.modifier is not None else set()
    groups: dict[Labels, list[float]] = {}
    for labels, v in vector.items():
        groups.setdefault(Labels((k, x) for k, x in labels if k in kept), []).append(v)
    reduce = {"sum": sum, "max": max, "min": min, "avg": lambda vs: sum(vs) / len(vs)}[str(node.op)]
    return {labels: reduce(values) for labels, values in groups.items()}


def _arithmetic(op: str, lhs, rhs):
    def apply(a: float, b: float) -> float:
        if op == "/":
            return a / b if b else math.nan
        return {"+": a + b, "-": a - b, "*": a * b}[op]

    if isinstance(lhs, float) and isinstance(rhs, float):
        return apply(lhs, rhs)
    if isinstance(rhs, float):
        return {labels: apply(v, rhs) for labels, v in lhs.items()}
    if isinstance(lhs, float):
        return {labels: apply(lhs, v) for labels, v in rhs.items()}
    return {labels: apply(v, rhs[labels]) for labels, v in lhs.items() if labels in rhs}


def series(expr: str, scrapes: Scrapes) -> dict[Labels, list[float]]:
    """An expression over every scrape, as Grafana would query it with every variable at All."""
    expr = expr.replace("$__rate_interval", RATE_WINDOW)
    expr = re.sub(r"\$\w+", ".*", expr)
    tree = promql_parser.parse(expr)
    found: dict[Labels, list[float]] = {}
    for at in range(len(scrapes.times)):
        for labels, v in evaluate(tree, scrapes, at).items():
            found.setdefault(labels, [math.nan] * len(scrapes.times))[at] = v
    return found


# -- load ------------------------------------------------------------------------------------------

def _calls(url: str, model: str, stop: threading.Event, pause_s: float, fail_every: int = 0, distinct: int = 0):
    """Requests until ``stop``: every ``fail_every``-th one fails; ``distinct`` inputs repeat (cache hits)."""
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    draw = random.Random(0)
    count = 0
    while not stop.is_set():
        count += 1
        value = -1.0 if fail_every and count % fail_every == 0 else float(draw.randrange(distinct) if distinct else count)
        x = httpclient.InferInput("X", [1, 4], "FP32")
        x.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
        try:
            client.infer(model, [x])
        except InferenceServerException:
            pass
        stop.wait(pause_s)


def _start(url: str, model: str, threads: int, **kwargs) -> tuple[threading.Event, list[threading.Thread]]:
    stop = threading.Event()
    workers = [threading.Thread(target=_calls, args=(url, model, stop), kwargs=kwargs, daemon=True)
               for _ in range(threads)]
    for worker in workers:
        worker.start()
    return stop, workers


def _stop(load) -> None:
    stop, workers = load
    stop.set()
    for worker in workers:
        worker.join()


def run_demo_load() -> Scrapes:
    scrapes = Scrapes()
    with TritiumServer(GRAFANA / "demo_repo", "--cache-config", "local,size=1048576",
                       "--metrics-interval-ms", "500") as server:
        done = threading.Event()

        def scrape_every_second():
            while not done.wait(SCRAPE_EVERY_S):
                scrapes.take(server.metrics_url)

        scraper = threading.Thread(target=scrape_every_second, daemon=True)
        scraper.start()
        steady = [_start(server.url, "plain", 2, pause_s=0.02, fail_every=25),
                  _start(server.url, "cached", 1, pause_s=0.02, distinct=300)]
        time.sleep(6)
        burst = _start(server.url, "elastic", 6, pause_s=0.0)
        time.sleep(12)
        _stop(burst)
        time.sleep(10)
        for load in steady:
            _stop(load)
        done.set()
        scraper.join()
    return scrapes


# -- drawing ---------------------------------------------------------------------------------------

BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d", "#fade2a"]
UNITS = {"reqps": (1, "req/s"), "ops": (1, "ops/s"), "short": (1, ""), "watt": (1, "W"),
         "percentunit": (100, "%"), "µs": (1e-3, "ms")}


def _legend(template: str, labels: Labels) -> str:
    values = dict(labels)
    return re.sub(r"\{\{ *(\w+) *\}\}", lambda m: values.get(m.group(1), ""), template) or str(dict(labels))


def _draw_panel(ax, panel: dict, scrapes: Scrapes) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(panel["title"], color=TEXT, fontsize=9, loc="left")
    scale, suffix = UNITS[panel["fieldConfig"]["defaults"]["unit"]]
    seconds = np.array(scrapes.times) - scrapes.times[0]
    custom = panel["fieldConfig"]["defaults"]["custom"]
    lines = [(_legend(t.get("legendFormat", ""), labels), np.array(values) * scale)
             for t in panel["targets"] for labels, values in sorted(series(t["expr"], scrapes).items(), key=str)]
    if not lines:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    elif custom.get("stacking"):
        ax.stackplot(seconds, *[np.nan_to_num(v) for _, v in lines], labels=[n for n, _ in lines],
                     colors=COLORS[:len(lines)], alpha=0.7)
    elif custom.get("drawStyle") == "bars":
        width = SCRAPE_EVERY_S * 0.8 / len(lines)
        for i, (name, values) in enumerate(lines):
            ax.bar(seconds + i * width, np.nan_to_num(values), width=width, label=name, color=COLORS[i % len(COLORS)])
    else:
        for i, (name, values) in enumerate(lines):
            ax.plot(seconds, values, label=name, color=COLORS[i % len(COLORS)], linewidth=1.2)
    if lines:
        ax.set_ylim(bottom=0)
        ax.set_ylabel(suffix, color=TEXT, fontsize=7)
        ax.set_xlabel("seconds", color=TEXT, fontsize=7)
        ax.legend(fontsize=6, loc="upper left", ncol=3, frameon=False, labelcolor=TEXT)
    ax.tick_params(colors=TEXT, labelsize=6)
    ax.grid(color=GRID, linewidth=0.5)
    for spine in ax.spines.values():
        spine.set_color(GRID)


def draw(dashboard: dict, scrapes: Scrapes, output: Path) -> None:
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    unit_px, width_px, top_px = 30, 1800, 60
    height_px = bottom * unit_px + top_px
    figure = plt.figure(figsize=(width_px / 100, height_px / 100), dpi=100, facecolor=BACKGROUND)
    figure.text(0.01, 1 - 20 / height_px, f"{dashboard['title']}: a rendering of the dashboard's panels "
                "(matplotlib, from real scrapes of tritium serve under a 30 s demo load; not a Grafana screenshot)",
                color=TEXT, fontsize=11, va="top")
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        left, top = box["x"] / 24, (top_px + box["y"] * unit_px) / height_px
        if panel["type"] == "row":
            figure.text(left + 0.005, 1 - top - 0.5 * unit_px / height_px, panel["title"], color=TEXT,
                        fontsize=11, fontweight="bold", va="center")
            continue
        # Leave room inside the grid cell for ticks and titles, as Grafana's panel chrome does.
        ax = figure.add_axes([left + 0.025, 1 - (top_px + (box["y"] + box["h"]) * unit_px - 35) / height_px,
                              box["w"] / 24 - 0.035, (box["h"] * unit_px - 70) / height_px])
        _draw_panel(ax, panel, scrapes)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, facecolor=BACKGROUND)


def main() -> None:
    output = Path(sys.argv[1] if len(sys.argv) > 1 else "grafana-dashboard.png")
    dashboard = json.loads((GRAFANA / "tritium-dashboard.json").read_text())
    draw(dashboard, run_demo_load(), output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
