"""tritium's autoscaling setting, read from a model's ``parameters`` so the config stays Triton's.

    parameters { key: "tritium.autoscale" value: { string_value: "min=0,max=8,idle_s=300,target_queue_ms=20,cooldown_s=2" } }

Every key is optional. Without the parameter a model keeps the fixed instance counts of
its ``instance_group``, exactly as in Triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tritium.repo.errors import ModelLoadError

PARAMETER = "tritium.autoscale"
MAX_COOLDOWN_S = 86400.0


@dataclass(frozen=True)
class AutoscalePolicy:
    min_instances: int = 1          # never fewer; 0: no instance at all while idle
    max_instances: int = 4          # never more, over all worker hosts
    idle_s: float = 300.0           # no request for this long: one instance fewer
    target_queue_ms: float = 20.0   # the oldest queued request waiting longer: one instance more
    cooldown_s: float = 2.0         # between two scaling steps of the model


_KEYS = {"min": ("min_instances", int), "max": ("max_instances", int), "idle_s": ("idle_s", float),
         "target_queue_ms": ("target_queue_ms", float), "cooldown_s": ("cooldown_s", float)}


def autoscale_policy(config) -> AutoscalePolicy | None:
    """The model's policy, None without the parameter; ModelLoadError naming the key if malformed."""
    if PARAMETER not in config.parameters:
        return None
    text = config.parameters[PARAMETER].string_value
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, raw = item.partition("=")
        if key not in _KEYS or not equals:
            raise ModelLoadError(config.name, f"parameter '{PARAMETER}': unknown setting '{item}' "
                                 f"(expected {', '.join(k + '=' for k in _KEYS)})")
        field, kind = _KEYS[key]
        try:
            values[field] = kind(raw)
        except ValueError:
            raise ModelLoadError(config.name, f"parameter '{PARAMETER}': '{key}' must be "
                                 f"{'an integer' if kind is int else 'a number'}, got '{raw}'") from None
    policy = AutoscalePolicy(**values)
    if policy.min_instances < 0 or policy.max_instances < max(1, policy.min_instances):
        raise ModelLoadError(config.name, f"parameter '{PARAMETER}': need 0 <= min <= max and max >= 1, "
                             f"got min={policy.min_instances}, max={policy.max_instances}")
    if not all(math.isfinite(v) for v in (policy.idle_s, policy.target_queue_ms, policy.cooldown_s)) \
            or policy.idle_s <= 0 or policy.target_queue_ms < 0 or not 0 <= policy.cooldown_s <= MAX_COOLDOWN_S:
        raise ModelLoadError(config.name, f"parameter '{PARAMETER}': 'idle_s' must be a positive number, "
                             f"'target_queue_ms' a number not negative, 'cooldown_s' one from 0 to {MAX_COOLDOWN_S:g}")
    if config.HasField("sequence_batching") or config.model_transaction_policy.decoupled:
        raise ModelLoadError(config.name, f"parameter '{PARAMETER}': sequence and decoupled models "
                             "cannot scale their instances")
    return policy
