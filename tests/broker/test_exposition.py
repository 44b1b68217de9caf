"""The metrics page's text: readable by Prometheus's parser whatever the labels, named as declared."""

from __future__ import annotations

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tritium.broker.exposition import text_format
from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.registry import ModelRecord, ModelVersion, Registry, VersionState
from tests.broker.scheduler_world import CONFIG, definition


def test_a_label_name_prometheus_would_refuse_is_made_readable():
    family = Metric("nv_inference_count", "Number of inferences", "counter")
    family.add_sample("nv_inference_count", {"model": "m", "_my-tag": 'a "quoted"\nvalue', "9lives": "y"}, 3)
    text = text_format([family])
    assert 'nv_inference_count{_9lives="y",_my_tag="a \\"quoted\\"\\nvalue",model="m"} 3\n' in text
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.samples[0].labels == {"_9lives": "y", "_my_tag": 'a "quoted"\nvalue', "model": "m"}


def test_a_counter_named_with_total_keeps_it_without_samples():
    text = render(TritonCollector(Registry(), MetricsSettings())).decode()
    assert "# TYPE tritium_tensor_pool_overflows_total counter\n" in text
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert list(text_string_to_metric_families(text))


def _one_model() -> Registry:
    registry = Registry()
    version = ModelVersion("m", 1, definition(CONFIG), epoch=1)
    version.state = VersionState.READY
    registry.models["m"] = ModelRecord("m")
    registry.versions[version.key] = version
    return registry


def test_failure_reasons_come_in_triton_s_order():
    registry = _one_model()
    text = render(TritonCollector(registry, MetricsSettings())).decode()
    reasons = [line.split('reason="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("nv_inference_request_failure{")]
    assert reasons == ["OTHER", "BACKEND", "CANCELED", "REJECTED"]


def test_counter_latencies_false_leaves_out_the_duration_counters_and_unknown_keys_are_said_to_be_ignored(caplog):
    from tritium.cli import metrics_settings

    flags = {"metrics_address": "127.0.0.1", "metrics_port": 8002, "allow_cpu_metrics": "true",
             "allow_gpu_metrics": "true",
             "metrics_config": ("counter_latencies=false", "summary_latencies=true", "summary_max_age=5",
                                "summary_quantiles=0.5:0.05,0.99,0.9:0.01")}
    with caplog.at_level("WARNING"):
        settings = metrics_settings(flags)
    assert "--metrics-config summary_max_age=5 is ignored" in caplog.text
    assert "summary_quantiles: '0.99' is ignored" in caplog.text
    assert settings.summary_latencies and settings.summary_quantiles == (0.5, 0.9)
    registry = _one_model()
    declared = [line.split()[2] for line in render(TritonCollector(registry, settings)).decode().splitlines()
                if line.startswith("# TYPE nv_inference")]
    assert not [name for name in declared if name.endswith("_duration_us")]
    assert "nv_inference_request_success" in declared and "nv_inference_count" in declared
