"""Triton Python backend model: a pickled scikit-learn classifier, one predict_proba per request."""

import os
import pickle

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.pkl")
        with open(path, "rb") as file:
            self.model = pickle.load(file)

    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            probabilities = self.model.predict_proba(features).astype(np.float32)
            labels = probabilities.argmax(axis=1).astype(np.int64)[:, None]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("LABEL", labels),
                pb_utils.Tensor("PROBABILITIES", probabilities),
            ]))
        return responses
