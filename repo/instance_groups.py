"""Instance groups resolved for one host: names, kinds, counts and GPUs (Triton's rules).

This is the one host-specific step of loading a config, so it is a function of its own:
the broker applies it for the configuration it shows, and every worker host applies it
again, with its own GPUs, to the host-independent configuration it receives.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritium.model_config_proto import model_config_pb2

from tritium.repo.backends import ENSEMBLE_PLATFORM, ONNXRUNTIME
from tritium.repo.config_file import ModelConfig
from tritium.repo.errors import ModelLoadError

Group = model_config_pb2.ModelInstanceGroup
# Backends that default to two instances per CPU group (Triton: onnxruntime, tensorflow).
_TWO_CPU_INSTANCES = {ONNXRUNTIME, "tensorflow"}


def resolve_instance_groups(config: ModelConfig, gpus: Sequence[int] | None) -> None:
    """Fill defaults and resolve KIND_AUTO in place for a host with ``gpus``.

    ``gpus`` None: the serving hosts are elsewhere (a broker of its own); each host agent
    resolves and checks the groups against its GPUs when it places the instances.
    """
    model = config.name
    if config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling"):
        if len(config.instance_group) > 0:
            raise ModelLoadError(model, f"ensemble '{model}' must not specify 'instance_group'")
        return
    if len(config.instance_group) == 0:
        config.instance_group.add().name = model
    available = set(gpus or ())
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{model}_{index}"
        if gpus is None:
            group.count = max(group.count, 1)
            continue
        if group.kind == Group.KIND_AUTO:
            usable = available and all(g in available for g in group.gpus)
            group.kind = Group.KIND_GPU if usable else Group.KIND_CPU
        # Triton (NormalizeInstanceGroup) treats any count below 1 as unset, so a
        # negative count gets the default too rather than an error.
        if group.count < 1:
            two = group.kind == Group.KIND_CPU and config.backend in _TWO_CPU_INSTANCES
            group.count = 2 if two else 1
        if group.kind == Group.KIND_GPU and len(group.gpus) == 0:
            group.gpus.extend(sorted(available))
        _check_group(model, config, group, available)


def _check_group(model: str, config: ModelConfig, group, available: set[int]) -> None:
    prefix = f"instance group '{group.name}' of model '{model}'"
    if group.kind == Group.KIND_GPU:
        if len(group.gpus) == 0:
            raise ModelLoadError(model, f"{prefix} has kind KIND_GPU but no GPUs are available")
        for gpu in group.gpus:
            if gpu not in available:
                listed = ", ".join(str(g) for g in sorted(available)) or "none"
                raise ModelLoadError(
                    model, f"{prefix} specifies GPU {gpu}, which this host does not have "
                    f"(GPUs here: {listed})")
    elif len(group.gpus) > 0:
        raise ModelLoadError(
            model, f"{prefix} has kind {Group.Kind.Name(group.kind)} but specifies one or more GPUs")
    if len(group.profile) > 0:
        raise ModelLoadError(
            model, f"{prefix} specifies 'profile', which only TensorRT models use")
    seen = [g.name for g in config.instance_group]
    if seen.count(group.name) > 1:
        raise ModelLoadError(model, f"{prefix}: the name is used by more than one instance group")


def instance_kind_name(group) -> str:
    """``CPU``, ``GPU`` or ``MODEL``, as Python models see ``model_instance_kind``."""
    return Group.Kind.Name(group.kind).removeprefix("KIND_")
