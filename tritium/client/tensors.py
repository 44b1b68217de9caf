"""What the sync and async clients share: where to connect, the error type, and turning numpy
arrays into tritonclient inputs (by the model's metadata) and results back into arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

FINAL_RESPONSE = "triton_final_response"


class InferenceError(Exception):
    """The server refused or failed a request: its message and status (an HTTP status code
    such as ``"400"``, or a gRPC status such as ``"StatusCode.INVALID_ARGUMENT"``)."""

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @classmethod
    def of(cls, error: InferenceServerException) -> "InferenceError":
        return cls(error.message() or str(error), error.status())


@dataclass(frozen=True, slots=True)
class Endpoint:
    """``http://host:port``, ``grpc://host:port`` or ``host:port`` (HTTP unless ``protocol`` says)."""

    protocol: str
    address: str

    @classmethod
    def parse(cls, url: str, protocol: str | None) -> "Endpoint":
        scheme, found, address = url.partition("://")
        if not found:
            scheme, address = protocol or "http", url
        elif protocol and protocol != scheme:
            raise ValueError(f"url '{url}' and protocol '{protocol}' disagree")
        if scheme not in ("http", "grpc"):
            raise ValueError(f"protocol must be http or grpc, got '{scheme}'")
        return cls(scheme, address)


@dataclass(frozen=True, slots=True)
class Signature:
    """A model's inputs (name -> Triton datatype), from its metadata."""

    inputs: Mapping[str, str]

    @classmethod
    def of(cls, metadata: Mapping[str, Any]) -> "Signature":
        return cls({i["name"]: i["datatype"] for i in metadata.get("inputs", [])})


def as_arrays(signature: Signature, model: str, tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each input as an array of the model's datatype; an unknown name is the caller's mistake."""
    unknown = sorted(set(tensors) - set(signature.inputs))
    if unknown:
        raise InferenceError(f"model '{model}' has no input {', '.join(repr(n) for n in unknown)}; "
                             f"its inputs: {', '.join(signature.inputs)}", "400")
    arrays = {}
    for name, value in tensors.items():
        datatype = signature.inputs[name]
        if datatype == "BYTES":
            arrays[name] = np.asarray(value, dtype=object)
        else:
            arrays[name] = np.asarray(value, dtype=triton_to_np_dtype(datatype))
    return arrays


def build_inputs(module, signature: Signature, tensors: Mapping[str, Any], model: str) -> list:
    """tritonclient InferInputs (of ``module``: tritonclient.http or .grpc) holding ``tensors``."""
    arrays = as_arrays(signature, model, tensors)
    inputs = []
    for name, array in arrays.items():
        item = module.InferInput(name, list(array.shape), signature.inputs[name])
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def outputs_of(result) -> dict[str, np.ndarray]:
    """Every tensor of a tritonclient result (HTTP or gRPC), by name."""
    response = result.get_response()
    if isinstance(response, dict):
        names = [output["name"] for output in response.get("outputs", [])]
    else:
        names = [output.name for output in response.outputs]
    return {name: result.as_numpy(name) for name in names}


def stream_response(result, error) -> tuple[dict[str, np.ndarray], bool]:
    """One gRPC stream callback's outputs (may be empty) and whether it is its request's last."""
    if error is not None:
        raise InferenceError.of(error)
    parameters = result.get_response().parameters
    return outputs_of(result), FINAL_RESPONSE in parameters and parameters[FINAL_RESPONSE].bool_param
