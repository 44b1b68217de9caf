"""The onnxruntime backend (``platform: onnxruntime_onnx``).

Session options come from the config as Triton's onnxruntime backend reads them:
``parameters`` ``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode``
(0 sequential, 1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, and
``optimization { graph { level } }`` (-1 basic, 1 extended, unset = all). Parameters named
``session.*`` are passed to onnxruntime as session config entries (a tritium extension,
e.g. ``session.intra_op.allow_spinning``). GPU instances
use the CUDA execution provider when onnxruntime-gpu is installed (``pip install .[gpu]``).
"""

from __future__ import annotations

import logging

import numpy as np

from tritium.cpu_quota import threads_within_quota
from tritium.repo.config_file import ModelConfig
from tritium.repo.model_files import onnx_problem
from tritium.repo.onnx_autocomplete import OnnxSignature, OnnxTensorInfo
from tritium.errors import InvalidArgument
from tritium.workers.backends.base import Backend, Instance, InstanceContext, Model, ModelContext

log = logging.getLogger(__name__)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def create_model(self, context: ModelContext) -> Model:
        return OnnxRuntimeModel(context)


class OnnxRuntimeModel(Model):
    def __init__(self, context: ModelContext) -> None:
        self.context = context
        path = context.version_dir / (context.config.default_model_filename or "model.onnx")
        if path.is_dir():  # a large model is a folder holding model.onnx and its weight files
            path = path / "model.onnx"
        self.path = path

    def create_instance(self, context: InstanceContext) -> Instance:
        return OnnxRuntimeInstance(self, context)


def _int_parameter(parameters: dict[str, str], key: str, default: int) -> int:
    value = parameters.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"parameter '{key}' must be an integer, got '{value}'") from exc


def session_options(context: ModelContext):
    import onnxruntime as ort

    parameters = context.parameters
    options = ort.SessionOptions()
    intra = _int_parameter(parameters, "intra_op_thread_count", 0)
    inter = _int_parameter(parameters, "inter_op_thread_count", 0)
    if intra > 0:
        options.intra_op_num_threads = intra
    elif (within := threads_within_quota()) is not None:
        options.intra_op_num_threads = within
        log.info("model '%s': intra-op threads %d, for this process's CPU quota (intra_op_thread_count "
                 "sets them)", context.name, within)
    if inter > 0:
        options.inter_op_num_threads = inter
    if _int_parameter(parameters, "execution_mode", 0) == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    if _int_parameter(parameters, "enable_mem_arena", 1) == 0:
        options.enable_cpu_mem_arena = False
    if _int_parameter(parameters, "enable_mem_pattern", 1) == 0:
        options.enable_mem_pattern = False
    for key, value in parameters.items():
        if key.startswith("session."):  # onnxruntime session config entries, passed through
            options.add_session_config_entry(key, value)
    level = context.config.optimization.graph.level if context.config.optimization.HasField("graph") else 0
    options.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return options


class OnnxRuntimeInstance(Instance):
    def __init__(self, model: OnnxRuntimeModel, context: InstanceContext) -> None:
        import onnxruntime as ort

        providers: list = ["CPUExecutionProvider"]
        if context.kind == "GPU":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                # The process sees only its own GPU (CUDA_VISIBLE_DEVICES), as device 0.
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": 0}))
            else:
                log.warning("instance %s is KIND_GPU but this onnxruntime has no CUDA provider "
                            "(install tritium[gpu]); running on CPU", context.name)
        self.session = ort.InferenceSession(str(model.path), sess_options=session_options(model.context),
                                            providers=providers)
        check_against_config(model.context.name, model.context.config, self.session)
        self.providers = self.session.get_providers()
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.string_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}
        log.info("instance %s loaded %s with providers %s", context.name, model.path, self.providers)

    def execute_batch(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        feeds = {name: array for name, array in inputs.items() if name in self.input_names}
        for name in self.string_inputs & feeds.keys():
            feeds[name] = _as_text(name, feeds[name])
        results = self.session.run(output_names, feeds)
        return dict(zip(output_names, results))


def check_against_config(name: str, config, session) -> None:
    """Refuse to load when config.pbtxt and the ONNX file disagree on a tensor, as Triton's
    onnxruntime backend does, rather than fail every request later.

    The broker checked the file it read; this host's copy of the repository may differ.
    """
    checked = ModelConfig()
    checked.CopyFrom(config)
    checked.name = name
    problem = onnx_problem(checked, session_signature(session))
    if problem is not None:
        raise InvalidArgument(problem.message)


# onnxruntime's type names -> model config data type names
_ORT_TO_CONFIG = {
    "tensor(float)": "TYPE_FP32", "tensor(float16)": "TYPE_FP16", "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16", "tensor(int8)": "TYPE_INT8", "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32", "tensor(int64)": "TYPE_INT64", "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16", "tensor(uint32)": "TYPE_UINT32", "tensor(uint64)": "TYPE_UINT64",
    "tensor(bool)": "TYPE_BOOL", "tensor(string)": "TYPE_STRING",
}


def session_signature(session) -> OnnxSignature:
    def infos(args) -> tuple[OnnxTensorInfo, ...]:
        return tuple(OnnxTensorInfo(a.name, _ORT_TO_CONFIG.get(a.type, a.type),
                                    tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (a.shape or ())))
                     for a in args)

    return OnnxSignature(infos(session.get_inputs()), infos(session.get_overridable_initializers()),
                         infos(session.get_outputs()))


def _as_text(name: str, array: np.ndarray) -> np.ndarray:
    """onnxruntime's Python binding takes string tensors as str, not bytes."""
    text = np.empty(array.shape, dtype=np.object_)
    try:
        text.reshape(-1)[:] = [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"input '{name}' holds bytes that are not UTF-8; onnxruntime "
                              "string tensors take UTF-8 text") from exc
    return text
