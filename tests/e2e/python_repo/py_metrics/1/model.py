"""Counts its requests, keeps the last X in a gauge and observes each X in a histogram; X < 0
asks it for an increment of the counter by X, which Triton refuses (the error is its answer)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        requests = pb_utils.MetricFamily(name="py_metrics_requests", description="Requests the model answered",
                                         kind=pb_utils.MetricFamily.COUNTER)
        self.requests = requests.Metric(labels=labels)
        # The families are kept: as in Triton, a metric goes with the family it was made from.
        self.families = [requests,
                         pb_utils.MetricFamily(name="py_metrics_last_x", description="The last X",
                                               kind=pb_utils.MetricFamily.GAUGE),
                         pb_utils.MetricFamily(name="py_metrics_x", description="Every X",
                                               kind=pb_utils.MetricFamily.HISTOGRAM)]
        self.last = self.families[1].Metric(labels=labels)
        self.sizes = self.families[2].Metric(labels=labels, buckets=[1, 2.5, 10])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if x < 0:
                try:
                    self.requests.increment(x)
                except pb_utils.TritonModelException as exc:
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                    continue
            self.requests.increment(1)
            self.last.set(x)
            self.sizes.observe(x)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("VALUE", np.array([self.requests.value()], dtype=np.float64))]))
        return responses
