class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot find the weights file")

    def execute(self, requests):
        return []
