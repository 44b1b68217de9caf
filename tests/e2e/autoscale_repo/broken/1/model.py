"""A model whose instances cannot start: its cold starts fail with the cause."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights are not there")

    def execute(self, requests):
        raise AssertionError("never reached")
