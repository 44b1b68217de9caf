"""Triton Python backend model: 8-bit HWC images to the classifier's float CHW in [0, 1]."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            pixels = (images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", np.ascontiguousarray(pixels))]))
        return responses
