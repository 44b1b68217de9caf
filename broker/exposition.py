"""The Prometheus text format written as Triton's metrics library (prometheus-cpp) writes it.

prometheus_client writes every value as a Python float (``0.0``, ``2.5324961792e+10``) and
bucket bounds as ``le="100.0"``; Triton writes 16 significant digits, so integers as
integers (``0``, ``25324961792``, ``le="100"``). Tools that read Triton's /metrics with
patterns rather than a parser depend on it: perf_analyzer's ``--collect-metrics`` matches
``nv_gpu_memory_used_bytes{gpu_uuid="..."} (\\d+\\.?\\d*)``, so ``2.5e+10`` would read as 2.5.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from prometheus_client.core import Metric

_TYPES = {"unknown": "untyped"}
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LAST = ("le", "quantile")   # a bucket's bound, a summary's quantile: written after the other labels


def number_text(value: float) -> str:
    """``value`` as prometheus-cpp writes it: ``%.16g`` (integers below 10^16 without a
    fraction or an exponent), ``Nan``, ``+Inf``, ``-Inf``."""
    value = float(value)
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return format(value, ".16g")


def _ordered(labels: dict[str, str]) -> list[tuple[str, str]]:
    """Sorted by name, a bucket's ``le`` (a summary's ``quantile``) last: prometheus-cpp keeps
    labels in a sorted map and appends those. A name Prometheus would not read (a ``metric_tags``
    key such as ``my-tag``) has its other characters made ``_``: one bad name must not make the
    whole page unreadable."""
    return sorted(((_label_name(key), value) for key, value in labels.items()),
                  key=lambda item: (item[0] in _LAST, item[0]))


def _label_name(name: str) -> str:
    if _LABEL_NAME.fullmatch(name):
        return name
    name = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    return name if not name[:1].isdigit() else "_" + name


def _escaped_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escaped_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def text_format(families: Iterable[Metric]) -> str:
    """The families in the text format: HELP and TYPE, then the samples. A counter or gauge is
    declared under its samples' name (prometheus_client keeps a counter's name without
    ``_total``; Triton's counters have no such suffix, tritium's own do)."""
    lines = []
    for family in families:
        name = family.samples[0].name if family.samples and family.type not in ("histogram", "summary") \
            else family.name
        lines.append(f"# HELP {name} {_escaped_help(family.documentation)}")
        lines.append(f"# TYPE {name} {_TYPES.get(family.type, family.type)}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escaped_label(str(value))}"' for key, value in _ordered(sample.labels))
            lines.append(f"{sample.name}{{{labels}}} {number_text(sample.value)}" if labels
                         else f"{sample.name} {number_text(sample.value)}")
    return "\n".join(lines) + "\n" if lines else ""
