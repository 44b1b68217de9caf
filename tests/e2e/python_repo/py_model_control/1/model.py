import json

import numpy as np
import triton_python_backend_utils as pb_utils

CALLS = {"load": pb_utils.load_model, "unload": pb_utils.unload_model, "ready": pb_utils.is_model_ready}


def attempt(call):
    try:
        return f"ok {call()!r}"
    except Exception as exc:   # the model reports what the API raised, as a test needs to see it
        return f"{type(exc).__name__}: {exc}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = json.loads(pb_utils.get_input_tensor_by_name(request, "CALL").as_numpy()[0])
            args = call.get("args", {})
            if isinstance(args.get("files"), dict):   # file contents travel as text in the JSON
                args["files"] = {path: text.encode() for path, text in args["files"].items()}
            result = attempt(lambda: CALLS[call["op"]](**args))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", np.array([result], dtype=object))]))
        return responses
