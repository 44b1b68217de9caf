import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """CODE 0 answers; 1/3/5/6 answer with that TritonError; 2 with the default code; 4 raises; 7 calls sys.exit."""

    def initialize(self, args):
        # Triton attaches TritonError after model.py is imported: look it up here, not at import.
        self.codes = {1: pb_utils.TritonError.INVALID_ARG, 3: pb_utils.TritonError.NOT_FOUND,
                      5: pb_utils.TritonError.UNSUPPORTED, 6: pb_utils.TritonError.UNAVAILABLE}

    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])
            if code == 4:
                raise pb_utils.TritonModelException("the model raised on purpose")
            if code == 7:
                sys.exit(3)   # Triton's stub answers it as any exception; the model serves on
            if code == 2:
                error = pb_utils.TritonError("failed with the default code")
            elif code in self.codes:
                error = pb_utils.TritonError(f"failed with code {code}", self.codes[code])
            else:
                error = None
            tensors = [] if error else [pb_utils.Tensor("ECHO", pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy())]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors, error=error))
        return responses
