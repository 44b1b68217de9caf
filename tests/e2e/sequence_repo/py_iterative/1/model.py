"""An iterative model: each run of a request answers OUT = [its correlation id, its flags, the run's
number], and releases the request to run again (request rescheduling) until IN runs were made.
Decoupled, it sends each run's response; otherwise it returns the last run's. IN < 0 (not
decoupled): it releases the request to run again and returns a response too, which Triton refuses.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            key = request.correlation_id()
            run = self.runs[key] = self.runs.get(key, 0) + 1
            out = pb_utils.Tensor("OUT", np.array([key, request.flags(), run], np.int64))
            response = pb_utils.InferenceResponse([out])
            again = run < wanted or wanted < 0
            if again:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            if self.decoupled:
                final = 0 if again else pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                request.get_response_sender().send(response, flags=final)
            else:
                responses.append(None if again and wanted > 0 else response)
        return None if self.decoupled else responses
