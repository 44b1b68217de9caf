"""deploy/grafana: the dashboard imports as Grafana expects, and queries only what tritium exports.

A real ``tritium serve`` runs the demo repository the dashboard ships with (a plain model,
one with the response cache, one autoscaled to zero); after a little traffic every metric
the dashboard's PromQL names must be in its /metrics output with every label the query
matches on, aggregates by, or shows in a legend. The queries are read with a PromQL parser.
On a host without a GPU there are no GPU families: their labels are checked against the
broker's rendering of a host report that lists a GPU, as a GPU host's agent sends it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import dataclass

import numpy as np
import promql_parser
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.registry import Registry
from tritium.protocol import HostMetrics
from deploy.grafana import preview
from tests.servers import PROJECT_ROOT, TritiumServer

GRAFANA = PROJECT_ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "tritium-dashboard.json"
SAMPLE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')
SCRAPE_LABELS = {"job", "instance"}     # Prometheus adds these when it scrapes
GRAFANA_RANGE = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
GPU_REPORT = HostMetrics("gpu-host", 0.5, 2, 1, [{"uuid": "GPU-0", "utilization": 0.5, "memory_total": 2,
                                                  "memory_used": 1, "power_usage": 100.0, "power_limit": 300.0}])


@dataclass(frozen=True)
class Selector:
    """One metric a query reads, the labels it matches on, and the labels its result is shown by."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...]   # (label, op, value)
    grouping: tuple[str, ...]


def exposition(text: str) -> tuple[dict[str, list[dict]], set[str]]:
    """Samples' label sets by sample name, and the families declared by # TYPE."""
    samples: dict[str, list[dict]] = {}
    declared = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            declared.add(line.split()[2])
        match = SAMPLE.match(line)
        if match:
            samples.setdefault(match.group(1), []).append(dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
    return samples, declared


def selectors(expr: str) -> list[Selector]:
    for variable, value in GRAFANA_RANGE.items():
        expr = expr.replace(variable, value)
    found: list[Selector] = []
    _walk(promql_parser.parse(expr), (), found)
    return found


def _walk(node, grouping: tuple[str, ...], found: list[Selector]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        matchers = tuple((m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in node.matchers.matchers)
        found.append(Selector(node.name, matchers, grouping))
        return
    if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
        grouping = grouping + tuple(node.modifier.labels)
    for child in ("lhs", "rhs", "expr", "vector_selector", "param"):
        if hasattr(node, child) and getattr(node, child) is not None:
            _walk(getattr(node, child), grouping, found)
    for argument in getattr(node, "args", None) or ():
        _walk(argument, grouping, found)


def queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend) of every panel target and every label_values variable."""
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            found.append((panel["title"], target["expr"], target.get("legendFormat", "")))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*), *(\w+)\)", variable["query"]["query"])
            assert match, f"variable {variable['name']}: not a label_values query"
            # the label the variable lists must exist as the grouping of its metric
            found.append((f"variable {variable['name']}", f"max by ({match.group(2)}) ({match.group(1)})", ""))
    return found


def problems(dashboard: dict, samples: dict[str, list[dict]]) -> list[str]:
    """What the dashboard asks of metrics that ``samples`` do not have."""
    found = []
    for where, expr, legend in queries(dashboard):
        shown = set(re.findall(r"\{\{ *(\w+) *\}\}", legend))
        for selector in selectors(expr):
            label_sets = samples.get(selector.metric)
            if not label_sets:
                found.append(f"{where}: no metric {selector.metric}")
                continue
            exported = set().union(*label_sets) | SCRAPE_LABELS
            wanted = {label for label, _, _ in selector.matchers} | set(selector.grouping) | shown
            found += [f"{where}: {selector.metric} has no label {label}" for label in sorted(wanted - exported)]
            for label, op, value in selector.matchers:
                if op == "Equal" and not any(labels.get(label) == value for labels in label_sets):
                    found.append(f"{where}: {selector.metric} has no sample with {label}=\"{value}\"")
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def metrics_text():
    """/metrics of a real server after traffic that moves every family the dashboard shows."""
    with TritiumServer(GRAFANA / "demo_repo", "--cache-config", "local,size=1048576",
                       "--metrics-interval-ms", "200") as server:
        client = httpclient.InferenceServerClient(server.url)
        for model, sign in [("plain", 1), ("plain", -1), ("cached", 1), ("cached", 1), ("elastic", 1)]:
            x = httpclient.InferInput("X", [1, 4], "FP32")
            x.set_data_from_numpy(np.full((1, 4), sign, dtype=np.float32))
            try:
                client.infer(model, [x])
            except InferenceServerException:
                assert sign < 0, f"{model} failed"
        deadline = time.monotonic() + 10
        while True:   # the shared tensor pools come with the processes' heartbeats
            with urllib.request.urlopen(server.metrics_url) as response:
                text = response.read().decode()
            if "tritium_tensor_pool_bytes{" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        yield text


def test_the_dashboard_is_importable_with_a_prometheus_datasource_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and dashboard["uid"] and dashboard["title"]
    occupied = set()
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_the_dashboard_covers_what_operators_ask(dashboard):
    queried = {s.metric for _, expr, _ in queries(dashboard) for s in selectors(expr)}
    assert {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us", "nv_inference_count", "nv_inference_exec_count",
            "tritium_instances", "tritium_cold_starts_total", "tritium_cold_start_duration_us",
            "nv_cache_num_hits_per_model", "nv_cpu_utilization", "nv_gpu_utilization",
            "tritium_tensor_pool_used_bytes", "tritium_tensor_pool_overflows_total"} <= queried


def test_every_metric_and_label_the_dashboard_queries_is_exported(dashboard, metrics_text):
    samples, _ = exposition(metrics_text)
    queried = {s.metric for _, expr, _ in queries(dashboard) for s in selectors(expr)}
    without_samples = {name for name in queried if name not in samples}
    # Only the GPU families may be missing (this host has no GPU); a GPU host's report has them.
    assert all(name.startswith("nv_gpu_") for name in without_samples), without_samples
    gpu_samples, _ = exposition(render(_collector_with_a_gpu_host()).decode())
    assert problems(dashboard, {**gpu_samples, **samples}) == []


def test_the_check_catches_a_misspelled_metric_a_missing_label_and_an_absent_value(metrics_text):
    samples, _ = exposition(metrics_text)
    broken = {"panels": [{"title": "broken", "targets": [
        {"expr": 'sum by (model) (rate(nv_inference_request_sucess{model=~"$model"}[$__rate_interval]))'},
        {"expr": 'sum by (gpu) (nv_inference_pending_request_count)', "legendFormat": "{{model}}"},
        {"expr": 'rate(nv_inference_request_failure{reason="TIMEOUT"}[5m])'}]}],
        "templating": {"list": [{"name": "zone", "type": "query", "query": {"query": "label_values(nv_cpu_utilization, zone)"}}]}}
    assert problems(broken, samples) == [
        "broken: no metric nv_inference_request_sucess",
        "broken: nv_inference_pending_request_count has no label gpu",
        'broken: nv_inference_request_failure has no sample with reason="TIMEOUT"',
        "variable zone: nv_cpu_utilization has no label zone",
    ]


def test_the_preview_evaluates_rates_sums_and_ratios_as_prometheus_does():
    scrapes = preview.Scrapes()
    scrapes.add(0.0, 'c{model="a",version="1"} 10\nc{model="a",version="2"} 0\nd{model="a",version="1"} 5\n')
    scrapes.add(2.0, 'c{model="a",version="1"} 30\nc{model="a",version="2"} 20\nd{model="a",version="1"} 10\n')
    rates = preview.series('sum by (model) (rate(c{model=~"$model"}[$__rate_interval]))', scrapes)
    assert rates == {frozenset({("model", "a")}): [pytest.approx(float("nan"), nan_ok=True), 20.0]}
    ratio = preview.series("sum by (model) (increase(c[4s])) / sum by (model) (increase(d[4s]))", scrapes)
    assert ratio[frozenset({("model", "a")})][1] == 8.0
    assert preview.series('c{version!="1"}', scrapes) == {frozenset({("model", "a"), ("version", "2")}): [0.0, 20.0]}


def test_the_preview_draws_every_panel_of_the_dashboard(dashboard, metrics_text, tmp_path):
    scrapes = preview.Scrapes()
    scrapes.add(0.0, metrics_text)
    scrapes.add(1.0, metrics_text)
    output = tmp_path / "dashboard.png"
    preview.draw(dashboard, scrapes, output)
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert preview.series(queries(dashboard)[0][1], scrapes), "the first panel has series"


def _collector_with_a_gpu_host() -> TritonCollector:
    registry = Registry()
    registry.host_metrics["gpu-host"] = GPU_REPORT
    return TritonCollector(registry, MetricsSettings())
