"""Which instance processes a model version gets on this host (Triton's instance groups)."""

from __future__ import annotations

from dataclasses import dataclass

from tritium.repo import ModelConfig
from tritium.repo.instance_groups import instance_kind_name


@dataclass(frozen=True)
class InstancePlan:
    name: str              # Triton's instance name, what the model sees
    key: str               # unique per model version on this host: name, plus @gpuN for GPU instances
    kind: str              # "CPU", "GPU" or "MODEL"
    device_id: int         # GPU id on this host; 0 for CPU instances
    gpu: int | None        # the GPU the process is pinned to (CUDA_VISIBLE_DEVICES), if any
    group: int = 0         # the index of its instance group in the config


def plan_instances(config: ModelConfig) -> list[InstancePlan]:
    """One plan per instance: ``count`` per listed GPU for GPU groups, ``count`` for others."""
    plans = []
    for group_index, group in enumerate(config.instance_group):
        if group.passive:
            continue  # passive instances take no traffic from the scheduler
        kind = instance_kind_name(group)
        for index in range(group.count):
            name = f"{group.name}_{index}"  # Triton's: the group's name and the index, always
            if kind == "GPU":
                for gpu in group.gpus:
                    plans.append(InstancePlan(name, f"{name}@gpu{gpu}", kind, gpu, gpu, group_index))
            else:
                plans.append(InstancePlan(name, name, kind, 0, None, group_index))
    return plans


def plan_scaled(config: ModelConfig, count: int, gpus: tuple[int, ...]) -> list[InstancePlan]:
    """``count`` instances of an autoscaled model: its first group's kind, spread over ``gpus``.

    Instance numbers are stable (instance ``i`` keeps its name as the count changes), so
    that growing starts only the new ones and shrinking stops only the last ones.
    """
    group = config.instance_group[0]
    kind = instance_kind_name(group)
    plans = []
    for index in range(count):
        if kind == "GPU" and gpus:
            gpu = gpus[index % len(gpus)]
            name = f"{group.name}_{index // len(gpus)}"
            plans.append(InstancePlan(name, f"{name}@gpu{gpu}", kind, gpu, gpu))
        else:
            plans.append(InstancePlan(f"{group.name}_{index}", f"{group.name}_{index}", kind, 0, None))
    return plans
