"""Triton Python backend model: a bag-of-words sentiment score of each text.

SCORE is the mean weight of the text's words (weights.json, beside this file); LABEL is
"positive", "negative" or "neutral" by its sign.
"""

import json
import os
import re

import numpy as np
import triton_python_backend_utils as pb_utils

WORD = re.compile(r"[a-z']+")


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "weights.json")
        with open(path, encoding="utf-8") as file:
            self.weights = json.load(file)

    def score(self, text: bytes) -> float:
        words = WORD.findall(text.decode("utf-8", errors="replace").lower())
        return sum(self.weights.get(word, 0.0) for word in words) / max(len(words), 1)

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()[:, 0]
            scores = np.array([self.score(text) for text in texts], dtype=np.float32)
            labels = np.array([b"positive" if s > 0 else b"negative" if s < 0 else b"neutral" for s in scores],
                              dtype=object)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("LABEL", labels[:, None]),
                pb_utils.Tensor("SCORE", scores[:, None]),
            ]))
        return responses
