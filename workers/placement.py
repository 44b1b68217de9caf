"""Which instance processes a model version gets on this host (Triton's instance groups)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from tritium.repo import ModelConfig
from tritium.model_config_proto import model_config_pb2
from tritium.repo.instance_groups import instance_kind_name


@dataclass(frozen=True)
class InstancePlan:
    name: str              # Triton's instance name, what the model sees
    key: str               # unique per model version on this host: name, plus @gpuN for GPU instances
    kind: str              # "CPU", "GPU" or "MODEL"
    device_id: int         # GPU id on this host; 0 for CPU instances
    gpu: int | None        # the GPU the process is pinned to (CUDA_VISIBLE_DEVICES), if any
    group: int = 0         # the index of its instance group in the config
    passive: bool = False  # started and initialized, never given requests (Triton's passive groups)


def plan_instances(config: ModelConfig) -> list[InstancePlan]:
    """One plan per instance: ``count`` per listed GPU for GPU groups, ``count`` for others;
    passive groups' instances too (started and initialized as in Triton; the broker sends them nothing)."""
    plans = []
    for group_index, group in enumerate(config.instance_group):
        kind = instance_kind_name(group)
        for index in range(group.count):
            name = f"{group.name}_{index}"  # Triton's: the group's name and the index, always
            if kind == "GPU":
                for gpu in group.gpus:
                    plans.append(InstancePlan(name, f"{name}@gpu{gpu}", kind, gpu, gpu, group_index, group.passive))
            else:
                plans.append(InstancePlan(name, name, kind, 0, None, group_index, group.passive))
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


Running = TypeVar("Running")
Signature = tuple[bytes, int]


def instance_signature(group: model_config_pb2.ModelInstanceGroup, device_id: int) -> Signature:
    """What makes two instances interchangeable, as Triton decides it when it updates instance
    groups in place: their group's settings but its name and count, and the device."""
    settings = model_config_pb2.ModelInstanceGroup()
    settings.CopyFrom(group)
    settings.ClearField("name")
    settings.ClearField("count")
    return settings.SerializeToString(deterministic=True), device_id


def plan_signature(config: ModelConfig, plan: InstancePlan) -> Signature:
    return instance_signature(config.instance_group[plan.group], plan.device_id)


@dataclass
class InstanceGroupsUpdate(Generic[Running]):
    """New instance groups laid over the instances running for the old ones."""

    kept: list[tuple[Running, InstancePlan]] = field(default_factory=list)   # each with the plan it now fills
    new: list[InstancePlan] = field(default_factory=list)                    # plans no running instance fills
    leaving: list[Running] = field(default_factory=list)                     # running instances no plan keeps


def update_instance_groups(config: ModelConfig, plans: Sequence[InstancePlan],
                           running: Sequence[tuple[Running, Signature, str]]) -> InstanceGroupsUpdate[Running]:
    """Match ``plans`` (of the new ``config``) with ``running`` instances (each with its signature
    and key): a plan takes a running instance of its signature, the lowest key first, as Triton
    reuses an existing instance; a new plan whose key a running instance holds gets another."""
    update: InstanceGroupsUpdate[Running] = InstanceGroupsUpdate()
    free: dict[Signature, list[tuple[str, Running]]] = {}
    for item, signature, key in sorted(running, key=lambda entry: entry[2]):
        free.setdefault(signature, []).append((key, item))
    for plan in plans:
        candidates = free.get(plan_signature(config, plan))
        if candidates:
            update.kept.append((candidates.pop(0)[1], plan))
        else:
            update.new.append(plan)
    update.leaving = [item for candidates in free.values() for _, item in candidates]
    taken = {key for _, _, key in running}
    for index, plan in enumerate(update.new):
        key, suffix = plan.key, 1
        while key in taken:
            suffix += 1
            key = f"{plan.key}~{suffix}"
        taken.add(key)
        update.new[index] = replace(plan, key=key)
    return update
