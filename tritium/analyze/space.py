"""The configuration space of one model: what may vary, and each candidate as a config override."""

from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One setting of the knobs tritium analyze turns."""

    instance_count: int = 1
    kind: str = "KIND_CPU"
    max_batch_size: int = 0                 # 0: the model does not batch; left as it is
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        parts = [f"{self.instance_count}x{self.kind.removeprefix('KIND_').lower()}"]
        if self.max_batch_size:
            parts.append(f"batch {self.max_batch_size}")
        if self.dynamic_batching:
            parts.append(f"delay {self.max_queue_delay_us}us")
            if self.preferred_batch_sizes:
                parts.append("preferred " + ",".join(map(str, self.preferred_batch_sizes)))
        return " ".join(parts)


@dataclass(frozen=True)
class Space:
    """The bounds of the search, from the command line and what the model allows."""

    max_instance_count: int = 4
    batch_sizes: tuple[int, ...] = (0,)     # (0,): the model does not batch
    queue_delays_us: tuple[int, ...] = (0, 100, 1000)
    kinds: tuple[str, ...] = ("KIND_CPU",)
    sequence_model: bool = False

    @classmethod
    def of(cls, config: dict, max_instance_count: int, max_batch_size: int, queue_delays_us: tuple[int, ...],
           gpus: bool) -> "Space":
        own = int(config.get("max_batch_size", 0) or 0)
        sizes = (0,) if own <= 0 else tuple(_powers_of_two(max(max_batch_size, 1)))
        kinds = ("KIND_CPU", "KIND_GPU") if gpus else ("KIND_CPU",)
        return cls(max_instance_count, sizes, tuple(sorted(set(queue_delays_us))) or (0,), kinds,
                   "sequence_batching" in config)

    def first(self, batch_size: int, count: int, kind: str = "KIND_CPU") -> Candidate:
        """The plain candidate of a branch: dynamic batching on wherever the model may batch."""
        dynamic = batch_size > 1 and not self.sequence_model
        return Candidate(count, kind, batch_size, dynamic, 0, ())

    @property
    def upper_bound(self) -> int:
        """Candidates a brute-force grid would measure (the progress bar's first estimate)."""
        grid = len(self.batch_sizes) * self.max_instance_count
        refinements = (len(self.queue_delays_us) - 1 + 1) if max(self.batch_sizes) > 1 else 0
        return grid + refinements + len(self.kinds) - 1


def _powers_of_two(limit: int):
    size = 1
    while size <= limit:
        yield size
        size *= 2


def config_for(base: dict, candidate: Candidate) -> dict:
    """``base`` (the model's config as the server shows it) with the candidate's settings."""
    config = copy.deepcopy(base)
    config["instance_group"] = [{"count": candidate.instance_count, "kind": candidate.kind}]
    if candidate.max_batch_size:
        config["max_batch_size"] = candidate.max_batch_size
    if candidate.dynamic_batching:
        batching = dict(config.get("dynamic_batching") or {})
        batching["max_queue_delay_microseconds"] = candidate.max_queue_delay_us
        batching["preferred_batch_size"] = list(candidate.preferred_batch_sizes)
        config["dynamic_batching"] = batching
    elif candidate.max_batch_size == 1:
        config.pop("dynamic_batching", None)
    return config


def config_text(config: dict) -> str:
    """``config`` as config.pbtxt text, through Triton's own ModelConfig message."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    message = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    return text_format.MessageToString(message)
