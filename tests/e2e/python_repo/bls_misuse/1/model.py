import numpy as np

import triton_python_backend_utils as pb_utils


def call(case):
    """A BLS call its called model refuses, as Triton refuses it."""
    if case == "single answer of a decoupled model":
        return pb_utils.InferenceRequest(model_name="py_decoupled", requested_output_names=["INDEX"],
                                         inputs=[pb_utils.Tensor("COUNT", np.array([2], np.int32))]).exec()
    inputs = [pb_utils.Tensor(name, np.ones((1, 16), np.float32)) for name in ("INPUT0", "INPUT1")]
    return pb_utils.InferenceRequest(model_name="py_add_sub", requested_output_names=["OUTPUT0", "NOPE"],
                                     inputs=inputs).exec()


class TritonPythonModel:
    """ERROR: what the call's response says (empty if none); OUTPUTS: how many tensors it had. It
    also answers with a tensor its config does not declare, which its client must not see."""

    def execute(self, requests):
        responses = []
        for request in requests:
            case = pb_utils.get_input_tensor_by_name(request, "CASE").as_numpy()[0].decode()
            response = call(case)
            error = response.error().message() if response.has_error() else ""
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("ERROR", np.array([error.encode()], np.object_)),
                pb_utils.Tensor("OUTPUTS", np.array([len(response.output_tensors())], np.int32)),
                pb_utils.Tensor("UNDECLARED", np.array([1], np.int32))]))
        return responses
