"""Triton Python backend model: class probabilities to the best class's label and score."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels_path = os.path.join(args["model_repository"], "labels.txt")
        with open(labels_path, encoding="utf-8") as file:
            self.labels = np.array([line.strip().encode() for line in file if line.strip()], dtype=object)

    def execute(self, requests):
        responses = []
        for request in requests:
            probabilities = pb_utils.get_input_tensor_by_name(request, "PROBABILITIES").as_numpy()
            best = probabilities.argmax(axis=1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("LABEL", self.labels[best][:, None]),
                pb_utils.Tensor("SCORE", probabilities[np.arange(len(best)), best][:, None].astype(np.float32)),
            ]))
        return responses
