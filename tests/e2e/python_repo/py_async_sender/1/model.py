import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Not decoupled, ``async def execute``: answers from a task that runs on after execute returned."""

    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            task = asyncio.get_running_loop().create_task(self.answer_later(request.get_response_sender(), value))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return [None] * len(requests)

    async def answer_later(self, sender, value):
        await asyncio.sleep(0.05)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 1)]),
                    pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
