"""Validation of a model config, as written and completed; every message names the model and the field."""

from __future__ import annotations

from tritium.model_config_proto import model_config_pb2

from tritium.repo.backends import ENSEMBLE_PLATFORM, ONNXRUNTIME, PYTORCH
from tritium.repo.config_file import ModelConfig
from tritium.repo.autoscale import autoscale_policy
from tritium.repo.errors import ConfigRejected, InvalidInputsOutputs, ModelLoadError, NoVersions

_Input = model_config_pb2.ModelInput
_QueuePolicy = model_config_pb2.ModelQueuePolicy
_Control = model_config_pb2.ModelSequenceBatching.Control
WILDCARD = -1


def validate_basics(config: ModelConfig) -> None:
    """What must hold before versions are picked and auto-complete runs: the rules Triton checks
    while it polls the repository, on the config as written (refusing it: ConfigRejected), and the
    version policy.

    Checked first so that, say, a negative max_batch_size is reported as such and not
    as the ONNX auto-complete's "does not support batching".
    """
    _polling_rules(config)
    _validate_version_policy(config)


def validate_config(config: ModelConfig) -> None:
    """The completed config: the polling rules again (what only auto-complete broke, Triton meets as a
    version loads), then the inputs and outputs (InvalidInputsOutputs) and the rules of loading."""
    try:
        _polling_rules(config)
    except ConfigRejected as exc:
        raise ModelLoadError(exc.model, exc.detail) from exc
    _validate_version_policy(config)
    _validate_io(config)
    for state in config.sequence_batching.state:
        _validate_state(config.name, state)
    _validate_transaction_policy(config)
    autoscale_policy(config)   # a malformed tritium.autoscale fails the load, naming the setting


def _polling_rules(config: ModelConfig) -> None:
    """Triton's ValidateModelConfig, which it runs while polling the repository."""
    model = config.name
    if config.max_batch_size < 0:
        _reject(model, f"'max_batch_size' must be non-negative, got {config.max_batch_size}")
    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)
    if config.platform == ENSEMBLE_PLATFORM and not config.HasField("ensemble_scheduling"):
        _reject(model, f"ensemble scheduling must be set for ensemble '{model}' whose platform is ensemble")
    if config.HasField("ensemble_scheduling") and config.platform != ENSEMBLE_PLATFORM:
        _reject(model, f"'ensemble_scheduling' is set but platform is '{config.platform}', not 'ensemble'")
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        _reject(model, decoupled_cache_refusal(model))


def _fail(model: str, message: str) -> None:
    raise ModelLoadError(model, f"model '{model}': {message}")


def _fail_io(model: str, message: str) -> None:
    raise InvalidInputsOutputs(model, f"model '{model}': {message}")


def decoupled_cache_refusal(model: str) -> str:
    """Triton's words for a decoupled model (or an ensemble made decoupled by a step) that caches."""
    return (f"Response Cache does not currently support model {model} with 'decoupled' transaction policy. "
            "Please disable the response cache.")


def _reject(model: str, message: str) -> None:
    """A rule Triton checks while it polls the repository (ValidateModelConfig), not as a version loads."""
    raise ConfigRejected(model, f"model '{model}': {message}")


def _no_versions(model: str, message: str) -> None:
    """A version policy Triton finds wrong as it picks the versions to load (its lifecycle then holds
    the model without versions)."""
    raise NoVersions(model, f"model '{model}': {message}")


def _validate_version_policy(config: ModelConfig) -> None:
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 1:
        _no_versions(config.name, "version_policy latest must have num_versions >= 1, got "
                     f"{policy.latest.num_versions}")
    if policy.WhichOneof("policy_choice") == "specific":
        if len(policy.specific.versions) == 0:
            _no_versions(config.name, "version_policy specific must list at least one version")
        for version in policy.specific.versions:
            if version < 0:
                _no_versions(config.name, f"version_policy specific lists version {version}; "
                             "versions are non-negative")


def _validate_io(config: ModelConfig) -> None:
    model = config.name
    for kind, tensors in (("input", config.input), ("output", config.output)):
        names = [t.name for t in tensors]
        for tensor in tensors:
            if not tensor.name:
                _fail_io(model, f"every {kind} must specify 'name'")
            if names.count(tensor.name) > 1:
                _fail_io(model, f"{kind} '{tensor.name}' is listed more than once")
            _validate_tensor(config, kind, tensor)
    clash = {t.name for t in config.input} & {t.name for t in config.output}
    if clash and config.platform == ENSEMBLE_PLATFORM:
        _fail_io(model, f"ensemble tensor '{sorted(clash)[0]}' is both an input and an output")


def _validate_tensor(config: ModelConfig, kind: str, tensor) -> None:
    model, name = config.name, tensor.name
    where = f"{kind} '{name}'"
    if tensor.data_type == model_config_pb2.TYPE_INVALID:
        _fail_io(model, f"{where} must specify 'data_type'")
    if len(tensor.dims) == 0:
        _fail_io(model, f"{where} must specify 'dims' (use dims: [ 1 ] with reshape: "
                 "{ shape: [ ] } for a scalar)")
    for dim in tensor.dims:
        if dim < 1 and dim != WILDCARD:
            _fail_io(model, f"{where} has dimension {dim}; a dimension must be an integer >= 1, "
                     "or -1 for a variable-size dimension")
    if tensor.HasField("reshape"):
        if len(tensor.reshape.shape) == 0 and config.max_batch_size == 0:
            _fail_io(model, f"{where} cannot have an empty reshape for a non-batching model "
                     "(scalar tensors need max_batch_size > 0)")
        _check_reshape(model, where, list(tensor.dims), list(tensor.reshape.shape))
    if kind == "input" and tensor.format in (_Input.FORMAT_NHWC, _Input.FORMAT_NCHW) \
            and len(tensor.dims) != 3:
        _fail_io(model, f"{where} has format {_Input.Format.Name(tensor.format)}, which needs "
                 f"exactly 3 dims, got {len(tensor.dims)}")
    if tensor.is_shape_tensor:
        _fail_io(model, f"{where} sets is_shape_tensor, which only TensorRT models support")


def _check_reshape(model: str, where: str, dims: list[int], shape: list[int]) -> None:
    for dim in shape:
        if dim < 1 and dim != WILDCARD:
            _fail_io(model, f"{where} has reshape dimension {dim}; a dimension must be >= 1 or -1")
    if (WILDCARD in dims) != (WILDCARD in shape):
        _fail_io(model, f"{where} has different sizes for dims {dims} and reshape {shape}")
    if WILDCARD not in dims:
        if _product(dims) != _product(shape):
            _fail_io(model, f"{where} has dims {dims} ({_product(dims)} elements) but reshape "
                     f"{shape} ({_product(shape)} elements)")
        return
    # Variable dims: the fixed runs between wildcards must hold the same element counts.
    if _runs(dims) != _runs(shape):
        _fail_io(model, f"{where} has different sizes for dims {dims} and reshape {shape}")


def _product(dims: list[int]) -> int:
    count = 1
    for dim in dims:
        count *= dim
    return count


def _runs(dims: list[int]) -> list[int]:
    runs, current = [], 1
    for dim in dims:
        if dim == WILDCARD:
            runs.append(current)
            current = 1
        else:
            current *= dim
    runs.append(current)
    return runs


def _validate_dynamic_batching(config: ModelConfig) -> None:
    model, batching = config.name, config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0:
            _reject(model, f"dynamic_batching preferred_batch_size {size} must be positive")
        if size > config.max_batch_size:
            _reject(model, f"dynamic_batching preferred_batch_size {size} is larger than "
                    f"max_batch_size {config.max_batch_size}")
    levels = batching.priority_levels
    if levels != 0:
        if batching.default_priority_level == 0 or batching.default_priority_level > levels:
            _reject(model, f"dynamic_batching default_priority_level must be in range [1, "
                    f"{levels}], got {batching.default_priority_level}")
        for level in batching.priority_queue_policy:
            if level == 0 or level > levels:
                _reject(model, f"dynamic_batching priority_queue_policy level {level} must be "
                        f"in range [1, {levels}]")
    if batching.preserve_ordering:
        if levels > 1:
            _reject(model, "only one priority level is allowed when 'preserve_ordering' is true")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds != 0 and policy.timeout_action == _QueuePolicy.DELAY:
                _reject(model, "a queue policy cannot have timeout_action DELAY when "
                        "'preserve_ordering' is true")


def _validate_sequence_batching(config: ModelConfig) -> None:
    model, batching = config.name, config.sequence_batching
    if config.response_cache.enable:   # (Triton's words)
        _reject(model, f"Response Cache does not currently support model {model} with sequence batching scheduler. "
                "Please disable the response cache.")
    seen_tensors: set[str] = set()
    seen_kinds: set[int] = set()
    for control_input in batching.control_input:
        if not control_input.name:
            _reject(model, "every sequence_batching control_input must have a name")
        if control_input.name in seen_tensors:
            _reject(model, f"sequence_batching control tensor '{control_input.name}' is "
                    "specified more than once")
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            kind = _Control.Kind.Name(control.kind)
            if control.kind in seen_kinds:
                _reject(model, f"sequence_batching specifies more than one {kind} tensor")
            seen_kinds.add(control.kind)
            _validate_control(model, control_input.name, control)
    if batching.WhichOneof("strategy_choice") == "oldest":
        for size in batching.oldest.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                _reject(model, f"sequence_batching oldest preferred_batch_size {size} must be in "
                        f"range [1, max_batch_size {config.max_batch_size}]")
    if batching.WhichOneof("strategy_choice") == "direct":
        utilization = batching.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            _reject(model, f"sequence_batching direct minimum_slot_utilization {utilization} must "
                    "be in range (0.0, 1.0]")


def _validate_state(model: str, state) -> None:
    """Implicit state: Triton's checks of ``initial_state``, with its texts (a state without a
    data type, which Triton loads and cannot use, is refused here)."""
    name = state.input_name
    if state.data_type == model_config_pb2.TYPE_INVALID:
        _fail(model, f"sequence_batching state '{name}' must specify a data_type")
    if len(state.initial_state) > 1:
        _fail(model, f"initial_state field for state input '{name}' must contain exactly one or zero element. "
              f"Found '{len(state.initial_state)}' elements.")
    if not state.initial_state:
        return
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        _fail(model, f"The data type used for 'initial_state' field of state '{name}' does not match the state "
              "data type.")
    if not initial.name:
        _fail(model, f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(initial.dims) != len(state.dims):
        _fail(model, "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for "
              f"state input '{name}'. {len(initial.dims)} != {len(state.dims)}")
    for initial_dim, state_dim in zip(initial.dims, state.dims):
        if initial_dim == -1:
            _fail(model, f"'initial_state' field for state input name '{name}' contains variable dimensions.")
        if state_dim != -1 and initial_dim != state_dim:
            _fail(model, f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. "
                  f"{initial_dim} != {state_dim}")
    if initial.WhichOneof("state_data") is None:
        _fail(model, f"initial_state setting expects state'{name}' to have state_data set")


def _validate_control(model: str, tensor: str, control) -> None:
    kind = _Control.Kind.Name(control.kind)
    values = [len(control.int32_false_true), len(control.fp32_false_true),
              len(control.bool_false_true)]
    if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
        if any(values):
            _reject(model, f"sequence_batching control '{tensor}' ({kind}) must not specify "
                    "false/true values")
        # TYPE_STRING as Triton 2.51 loads it (CORRID as a one-element BYTES tensor).
        allowed = (model_config_pb2.TYPE_UINT64, model_config_pb2.TYPE_INT64,
                   model_config_pb2.TYPE_UINT32, model_config_pb2.TYPE_INT32, model_config_pb2.TYPE_STRING)
        if control.data_type not in allowed:
            _reject(model, f"sequence_batching control '{tensor}' ({kind}) has data type "
                    f"{model_config_pb2.DataType.Name(control.data_type)}; allowed are "
                    "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
        return
    given = [n for n in values if n]
    if len(given) != 1:
        _reject(model, f"sequence_batching control '{tensor}' ({kind}) must specify exactly one "
                "of int32_false_true, fp32_false_true or bool_false_true")
    if given[0] != 2:
        _reject(model, f"sequence_batching control '{tensor}' ({kind}) must have exactly 2 "
                f"false/true values, got {given[0]}")


def _validate_transaction_policy(config: ModelConfig) -> None:
    if not config.model_transaction_policy.decoupled:
        return
    model = config.name
    if config.backend in (ONNXRUNTIME, PYTORCH):
        _fail(model, f"'model_transaction_policy {{ decoupled: true }}' is not supported by "
              f"the {config.backend} backend; only python and custom backends can be decoupled")
