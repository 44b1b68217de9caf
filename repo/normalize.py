"""Triton's host-independent normalization of a config: the defaults it fills in."""

from __future__ import annotations

from tritium.repo.backends import ENSEMBLE_PLATFORM
from tritium.repo.config_file import ModelConfig

SEQUENCE_IDLE_DEFAULT_US = 1_000_000


def normalize_version_policy(config: ModelConfig) -> None:
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1


def normalize(config: ModelConfig) -> None:
    """Fill the defaults Triton fills (everything but instance groups, which are per host)."""
    normalize_version_policy(config)
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if len(batching.preferred_batch_size) == 0 and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        batching = config.sequence_batching
        if batching.max_sequence_idle_microseconds == 0:
            batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if batching.WhichOneof("strategy_choice") == "oldest":
            oldest = batching.oldest
            if len(oldest.preferred_batch_size) == 0 and config.max_batch_size > 0:
                oldest.preferred_batch_size.append(config.max_batch_size)
    if config.platform == ENSEMBLE_PLATFORM:
        # Decoupled when a step is: validation sets it once the steps' configs are known.
        config.model_transaction_policy.SetInParent()
    else:
        optimization = config.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True
