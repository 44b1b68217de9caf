"""Model control from a Python model: ``pb_utils.load_model``, ``unload_model``, ``is_model_ready``.

Triton's model loading API for BLS models. The instance asks the broker on its BLS socket, as a
gateway asks for a client's repository API call, and waits for the answer: a load until the model
is loaded (or has failed to), an unload until it has begun. Loading and unloading need
``--model-control-mode=explicit``, as in Triton. The checks and error texts are Triton's; the
arguments are converted as Triton's bindings convert them (text from str or bytes, a flag from
anything with a truth value).
"""

from __future__ import annotations

import re

from tritium.errors import TritiumError
from tritium.pb_utils.types import TritonModelException, as_text, incompatible_arguments, refused_by_server, runtime
from tritium.protocol import LoadModel, ModelsQuery, UnloadModel

_STOL = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")   # what C++'s std::stol reads of a version string
_READY = "READY"
_CAST = ("Unable to cast Python instance to C++ type (#define PYBIND11_DETAILED_ERROR_MESSAGES or compile in "
         "debug mode for details)")


def load_model(model_name: str, config: str = "", files: dict | None = None) -> None:
    """Load (or reload) ``model_name``, with an override ``config`` (JSON) and ``files``
    ({"file:<path>": bytes}) as the repository API's load takes them."""
    signature = "(model_name: str, config: str = '', files: object = None) -> None"
    model_name, config = _text("load_model", signature, model_name), _text("load_model", signature, config)
    parameters: dict = {}
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(f"failed to load model '{model_name}', files should be a dictionary of file "
                                       f"paths and file contents")
        for path, content in files.items():
            if not isinstance(path, (str, bytes)):
                raise RuntimeError(_CAST)
            if not isinstance(content, bytes):
                raise TypeError(f"Object of type '{type(content).__name__}' is not an instance of 'bytes'")
            parameters[as_text(path)] = bytes(content)
    if config:
        parameters["config"] = config
    _ask("Failed to load model", LoadModel(model_name, parameters))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (and the ensembles using it, with ``unload_dependents``); returns
    once the unload has begun, as Triton's does."""
    model_name = _text("unload_model", "(model_name: str, unload_dependents: bool = False) -> None", model_name)
    _ask("Failed to unload model", UnloadModel(model_name, bool(unload_dependents)))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the version is loaded and ready (with no version: the latest ready one, as a
    client's readiness request reads it); False for a model the server does not know."""
    signature = "(model_name: str, model_version: str = '') -> bool"
    model_name = _text("is_model_ready", signature, model_name)
    version = _version(_text("is_model_ready", signature, model_version))
    table = _ask("Failed to check model readiness", ModelsQuery())
    row = next((row for row in table["models"] if row["name"] == model_name), None)
    ready = {number: healthy for number, state, _, healthy in (row["versions"] if row else ()) if state == _READY}
    if version == -1:
        return bool(ready) and ready[max(ready)]
    return ready.get(version, False)


def _version(text: str) -> int:
    """-1 for none; as Triton reads a version string (std::stol: leading digits count)."""
    if not text:
        return -1
    match = _STOL.match(text)
    if match is None or not -2**63 <= int(match.group()) < 2**63:
        raise refused_by_server("Failed to check model readiness", f"failed to get model version from specified "
                                f"version string '{text}' (details: stol), version should be an integral value > 0")
    version = int(match.group())
    if version < 0:
        raise refused_by_server("Failed to check model readiness", f"failed to get model version from specified "
                                f"version string '{text}', version should be an integral value > 0")
    return version


def _ask(failed: str, args):
    """The broker's answer to ``args``, or Triton's exception for its refusal."""
    bls = runtime.bls
    if bls is None:   # an instance started without a broker (a backend's own tests)
        raise refused_by_server(failed, "this instance has no broker to ask")
    try:
        return bls.control(args)
    except TritiumError as exc:
        raise refused_by_server(failed, exc.message) from None


def _text(function: str, signature: str, value) -> str:
    """``value`` as the text a C++ string argument takes (str, or bytes as UTF-8); TypeError else."""
    value = as_text(value)
    if isinstance(value, str):
        return value
    raise incompatible_arguments(function, signature, value)
