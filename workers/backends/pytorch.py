"""The PyTorch backend (``platform: pytorch_libtorch``): TorchScript ``model.pt``.

Binding follows Triton's PyTorch backend. Inputs: by the names of ``forward``'s arguments
when the config uses them, else by the ``<name>__<index>`` convention, else in config
order; a ``forward`` taking one ``Dict[str, Tensor]`` gets a dict keyed by input name.
Outputs: a tensor, or a tuple or list of them, bound by ``<name>__<index>`` or config
order. Parameters read: ``INFERENCE_MODE`` (default true), ``DISABLE_OPTIMIZED_EXECUTION``,
``INTRA_OP_THREAD_COUNT``, ``INTER_OP_THREAD_COUNT``, ``ENABLE_CACHE_CLEANING``,
``DISABLE_CUDNN``. Only the instance processes of PyTorch models import torch.
"""

from __future__ import annotations

import logging
import re
import warnings

import numpy as np

from tritium import datatypes
from tritium.cpu_quota import threads_within_quota
from tritium.repo.model_files import forward_arguments, torchscript_problem
from tritium.errors import InternalError, InvalidArgument
from tritium.workers.backends.base import Backend, Instance, InstanceContext, Model, ModelContext

log = logging.getLogger(__name__)

_NAMED_INDEX = re.compile(r".*__(\d+)$")
# Inputs are views of the received bytes; torch only warns that it could write to them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="The given buffer is not writable")


def _flag(parameters: dict[str, str], key: str, default: bool) -> bool:
    value = parameters.get(key)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise InvalidArgument(f"parameter '{key}' must be true or false, got '{value}'")


def _count(parameters: dict[str, str], key: str) -> int:
    value = parameters.get(key)
    try:
        return int(value) if value else 0
    except ValueError as exc:
        raise InvalidArgument(f"parameter '{key}' must be an integer, got '{value}'") from exc


def _import_torch():
    try:
        import torch
    except ImportError:
        raise InvalidArgument("the pytorch backend needs PyTorch, which is not installed here: "
                              "pip install \"tritium[torch]\"") from None
    return torch


class PyTorchBackend(Backend):
    name = "pytorch"

    def create_model(self, context: ModelContext) -> Model:
        return PyTorchModel(context)


class PyTorchModel(Model):
    def __init__(self, context: ModelContext) -> None:
        torch = _import_torch()

        self.context = context
        parameters = context.parameters
        intra, inter = _count(parameters, "INTRA_OP_THREAD_COUNT"), _count(parameters, "INTER_OP_THREAD_COUNT")
        if intra > 0:
            torch.set_num_threads(intra)
        elif (within := threads_within_quota()) is not None:
            torch.set_num_threads(within)
            log.info("model '%s': intra-op threads %d, for this process's CPU quota (INTRA_OP_THREAD_COUNT "
                     "sets them)", context.name, within)
        if inter > 0:
            torch.set_num_interop_threads(inter)
        if _flag(parameters, "DISABLE_OPTIMIZED_EXECUTION", False):
            torch._C._set_graph_executor_optimize(False)
        if _flag(parameters, "DISABLE_CUDNN", False):
            torch.backends.cudnn.enabled = False
        self.inference_mode = _flag(parameters, "INFERENCE_MODE", True)
        self.cache_cleaning = _flag(parameters, "ENABLE_CACHE_CLEANING", False)
        self.path = context.version_dir / (context.config.default_model_filename or "model.pt")

    def create_instance(self, context: InstanceContext) -> Instance:
        return PyTorchInstance(self, context)


def _sequence_input_names(config) -> list[str]:
    if not config.HasField("sequence_batching"):
        return []
    sequence = config.sequence_batching
    return [c.name for c in sequence.control_input] + [s.input_name for s in sequence.state]


class PyTorchInstance(Instance):
    def __init__(self, model: PyTorchModel, context: InstanceContext) -> None:
        torch = _import_torch()

        self.torch = torch
        self.model_name = context.model.name
        self.inference_mode = model.inference_mode
        self.cache_cleaning = model.cache_cleaning
        self.device = torch.device("cpu")
        if context.kind == "GPU":
            if torch.cuda.is_available():
                self.device = torch.device("cuda:0")  # the process sees only its own GPU
            else:
                log.warning("instance %s is KIND_GPU but torch sees no GPU; running on CPU", context.name)
        self.module = torch.jit.load(str(model.path), map_location=self.device)
        self.module.eval()
        config = self.config = context.model.config
        # The sequence batcher's control and implicit-state inputs come to forward() too, as
        # Triton's backend binds them (by their __<index> names, or by forward's argument names).
        self.input_names = [i.name for i in config.input] + _sequence_input_names(config)
        self.string_inputs = {i.name for i in config.input if i.data_type == 13}  # TYPE_STRING
        self.dict_input, self.input_order = self._bind_inputs()
        state_outputs = [s.output_name for s in config.sequence_batching.state]
        self.output_index = self._bind_outputs([o.name for o in config.output] + state_outputs)
        log.info("instance %s loaded %s on %s", context.name, model.path, self.device)

    # -- binding ------------------------------------------------------------------------

    def _bind_inputs(self) -> tuple[bool, list[str]]:
        arguments = forward_arguments(self.module)
        problem = torchscript_problem(self.config, arguments)
        if problem is not None:
            raise InvalidArgument(problem.message)
        if len(arguments) == 1 and arguments[0].kind == "DictType":
            return True, list(self.input_names)
        argument_names = [a.name for a in arguments]
        if all(name in argument_names for name in self.input_names):
            return False, argument_names
        indexes = {name: int(m.group(1)) for name in self.input_names if (m := _NAMED_INDEX.match(name))}
        if all(name in indexes for name in self.input_names):
            return False, sorted(self.input_names, key=indexes.__getitem__)
        return False, list(self.input_names)

    @staticmethod
    def _bind_outputs(names: list[str]) -> dict[str, int]:
        indexes = {name: int(m.group(1)) for name in names if (m := _NAMED_INDEX.match(name))}
        if all(name in indexes for name in names):
            return indexes
        return {name: index for index, name in enumerate(names)}

    # -- execution ----------------------------------------------------------------------

    def execute_batch(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        torch = self.torch
        tensors = {name: self._to_torch(name, array) for name, array in inputs.items()}
        guard = torch.inference_mode() if self.inference_mode else torch.no_grad()
        try:
            with guard:
                if self.dict_input:
                    result = self.module(tensors)
                else:
                    result = self.module(*[tensors[name] for name in self.input_order])
        except Exception as exc:
            raise InternalError(f"PyTorch execute failure: {exc}") from exc
        outputs = self._outputs(result)
        if self.cache_cleaning and self.device.type == "cuda":
            torch.cuda.empty_cache()
        chosen = {}
        for name in output_names:
            index = self.output_index[name]
            if index >= len(outputs):
                raise InternalError(f"model '{self.model_name}' returned {len(outputs)} outputs, so "
                                    f"output '{name}' (index {index}) has none")
            chosen[name] = self._to_numpy(outputs[index])
        return chosen

    def _to_torch(self, name: str, array: np.ndarray):
        if name in self.string_inputs:  # TorchScript takes strings as List[str]
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
        if datatypes.is_bf16(array.dtype):
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16).to(self.device)
        return self.torch.from_numpy(array).to(self.device)

    def _outputs(self, result) -> list:
        torch = self.torch
        if isinstance(result, torch.Tensor):
            return [result]
        if isinstance(result, list) and all(isinstance(r, str) for r in result):
            return [result]  # one List[str] output
        if isinstance(result, (tuple, list)) and all(isinstance(r, (torch.Tensor, list)) for r in result):
            return list(result)
        raise InternalError(
            f"PyTorch execute failure: output must be a Tensor, a List[str] or a tuple or list of "
            f"them, got {type(result).__name__}")

    def _to_numpy(self, value) -> np.ndarray:
        if isinstance(value, list):  # List[str]
            return np.array([v.encode("utf-8") if isinstance(v, str) else v for v in value], dtype=np.object_)
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        if value.dtype == self.torch.bfloat16:
            import ml_dtypes

            return value.view(self.torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()
