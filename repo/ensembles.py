"""Validation of ensembles against the models they compose, with messages that name the step."""

from __future__ import annotations

from collections.abc import Mapping

from tritium.model_config_proto import model_config_pb2

from tritium.repo.backends import ENSEMBLE_PLATFORM
from tritium.repo.config_file import ModelConfig
from tritium.repo.errors import ModelLoadError
from tritium.repo.validate import decoupled_cache_refusal

WILDCARD = -1


def composing_models(config: ModelConfig) -> list[str]:
    return [step.model_name for step in config.ensemble_scheduling.step]


def validate_ensemble(config: ModelConfig, configs: Mapping[str, ModelConfig],
                      failures: Mapping[str, str]) -> None:
    """Check an ensemble's steps against the configs of the models it names.

    ``configs`` holds every model that loaded, ``failures`` the error of every model in
    the repository that did not.
    """
    name = config.name
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        _fail(name, "must have at least one step in 'ensemble_scheduling'")
    producers: dict[str, tuple[str, str, ModelConfig | None]] = {
        t.name: ("ensemble input", t.name, None) for t in config.input}
    for index, step in enumerate(steps):
        label = f"step {index} (model '{step.model_name}')" if step.model_name else f"step {index}"
        member = _member_config(name, label, step.model_name, configs, failures)
        _check_step_maps(name, label, step, member)
        # A model that does not batch may serve a batching ensemble: it gets the whole tensor.
        if 0 < member.max_batch_size < config.max_batch_size:
            _fail(name, f"allows max_batch_size {config.max_batch_size}, but {label} only "
                  f"allows {member.max_batch_size}")
        for model_output, tensor in step.output_map.items():
            if tensor in producers:
                _fail(name, f"ensemble tensor '{tensor}' is produced by {producers[tensor][0]} "
                      f"and by {label}")
            producers[tensor] = (label, model_output, member)
    _check_consumers(config, steps, configs, producers)
    _check_no_step_cycle(config, steps)
    _check_no_nested_cycle(config, configs)
    # As Triton: an ensemble with a decoupled step (or nested ensemble) is decoupled itself.
    config.model_transaction_policy.decoupled = _check_decoupled_flow(config, steps, configs)
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ModelLoadError(name, decoupled_cache_refusal(name))


def _member_config(name, label, model, configs, failures) -> ModelConfig:
    if not model:
        _fail(name, f"{label} must name a model in 'model_name'")
    if model == name:
        _fail(name, f"{label} names the ensemble itself")
    if model in failures:
        _fail(name, f"{label}: model '{model}' failed to load: {failures[model]}")
    if model not in configs:
        _fail(name, f"{label} names model '{model}', which is not in the model repository")
    return configs[model]


def _check_step_maps(name, label, step, member: ModelConfig) -> None:
    inputs = {t.name: t for t in member.input}
    outputs = {t.name for t in member.output}
    for model_input in step.input_map:
        if model_input not in inputs:
            _fail(name, f"{label} maps input '{model_input}', which model "
                  f"'{member.name}' does not have (its inputs: {sorted(inputs)})")
    for model_input, tensor in inputs.items():
        if model_input not in step.input_map and not tensor.optional:
            _fail(name, f"input '{model_input}' of {label} is not mapped to any ensemble tensor")
    for model_output in step.output_map:
        if model_output not in outputs:
            _fail(name, f"{label} maps output '{model_output}', which model "
                  f"'{member.name}' does not have (its outputs: {sorted(outputs)})")


def _check_consumers(config, steps, configs, producers) -> None:
    name = config.name
    ensemble_inputs = {t.name: t for t in config.input}
    for index, step in enumerate(steps):
        label = f"step {index} (model '{step.model_name}')"
        member = configs[step.model_name]
        member_inputs = {t.name: t for t in member.input}
        for model_input, tensor in step.input_map.items():
            if tensor not in producers:
                _fail(name, f"{label} reads ensemble tensor '{tensor}', which no ensemble "
                      "input or step output produces")
            consumer = member_inputs[model_input]
            _check_connection(config, tensor, producers[tensor], ensemble_inputs,
                              f"input '{model_input}' of {label}", consumer, list(consumer.dims),
                              member.max_batch_size)
    for output in config.output:
        if output.name not in producers:
            _fail(name, f"ensemble output '{output.name}' is not produced by any step")
        _check_connection(config, output.name, producers[output.name], ensemble_inputs,
                          f"ensemble output '{output.name}'", output, _io_dims(output), config.max_batch_size)


def _check_connection(config, tensor, producer, ensemble_inputs, consumer_label,
                      consumer, consumer_dims: list[int], consumer_mbs: int) -> None:
    origin, produced_name, member = producer
    if member is None:
        source, source_mbs = ensemble_inputs[produced_name], config.max_batch_size
        source_dims = _io_dims(source)
    else:
        source = next(t for t in member.output if t.name == produced_name)
        source_mbs, source_dims = member.max_batch_size, list(source.dims)
    if source.data_type != consumer.data_type:
        _fail(config.name, f"ensemble tensor '{tensor}' is "
              f"{model_config_pb2.DataType.Name(source.data_type)} from {origin} but "
              f"{consumer_label} expects {model_config_pb2.DataType.Name(consumer.data_type)}")
    source_shape = _full_shape(source_dims, source_mbs)
    consumer_shape = _full_shape(consumer_dims, consumer_mbs)
    # As Triton: equal shapes without the batch dimension, or equal full shapes (a model
    # that does not batch taking [-1, 4] from one that batches [4]).
    if not _compatible(source_dims, consumer_dims) and not _compatible(source_shape, consumer_shape):
        _fail(config.name, f"ensemble tensor '{tensor}' has shape {source_shape} from {origin} "
              f"but {consumer_label} expects shape {consumer_shape}")


def _io_dims(tensor) -> list[int]:
    """An ensemble input's or output's shape as its steps see it: its reshape, if it has one."""
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def _full_shape(dims, max_batch_size: int) -> list[int]:
    return ([WILDCARD] if max_batch_size > 0 else []) + list(dims)


def _compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD in (x, y) for x, y in zip(a, b))


def _check_no_step_cycle(config, steps) -> None:
    produced_by = {}
    for index, step in enumerate(steps):
        for tensor in step.output_map.values():
            produced_by[tensor] = index
    edges = {index: {produced_by[t] for t in step.input_map.values() if t in produced_by}
             for index, step in enumerate(steps)}
    state: dict[int, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: int, path: list[int]) -> None:
        state[node] = 1
        for before in edges[node]:
            if state.get(before) == 1:
                cycle = path[path.index(before):] + [before] if before in path else [node, before]
                _fail(config.name, "steps form a cycle: " + " -> ".join(
                    f"step {i} (model '{steps[i].model_name}')" for i in cycle))
            if state.get(before) is None:
                visit(before, path + [before])
        state[node] = 2

    for index in edges:
        if index not in state:
            visit(index, [index])


def _check_decoupled_flow(config, steps, configs) -> bool:
    """Whether a step is decoupled; a step whose inputs come from different decoupled steps (or
    from one and the ensemble's inputs) is refused, as Triton refuses it: their responses do
    not pair up. Steps are acyclic here."""
    decoupled = {index for index, step in enumerate(steps) if _is_decoupled(configs[step.model_name], configs)}
    origin = {t.name: -1 for t in config.input}   # tensor -> the decoupled step it flows from (-1: none)
    pending = list(enumerate(steps))
    while pending:
        waiting = []
        for index, step in pending:
            if any(tensor not in origin for tensor in step.input_map.values()):   # not produced yet
                waiting.append((index, step))
                continue
            sources = {origin[tensor] for tensor in step.input_map.values()}
            if len(sources) > 1:
                _fail(config.name, f"step {index} (model '{step.model_name}') receives inputs originated from "
                      "different decoupled models")
            source = index if index in decoupled else next(iter(sources), -1)
            for tensor in step.output_map.values():
                origin[tensor] = source
        if len(waiting) == len(pending):
            break   # steps reading tensors nobody produces were refused before; none are left
        pending = waiting
    return bool(decoupled)


def _is_decoupled(member, configs) -> bool:
    """A model's own policy; a nested ensemble's from its steps (its config may not be checked yet)."""
    if member.platform != ENSEMBLE_PLATFORM:
        return member.model_transaction_policy.decoupled
    return any(_is_decoupled(configs[child], configs) for child in composing_models(member) if child in configs)


def _check_no_nested_cycle(config, configs) -> None:
    def walk(model: str, path: list[str]) -> None:
        member = configs.get(model)
        if member is None or member.platform != ENSEMBLE_PLATFORM:
            return
        for child in composing_models(member):
            if child in path:
                _fail(config.name, "ensembles form a cycle: " + " -> ".join(path + [child]))
            walk(child, path + [child])

    walk(config.name, [config.name])


def _fail(name: str, message: str) -> None:
    raise ModelLoadError(name, f"ensemble '{name}': {message}")
