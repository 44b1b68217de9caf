"""A complete custom backend for tritium: ``backend: "scale"`` multiplies INPUT0 by a factor.

tritium finds it because the model folder holds ``tritium_scale.py`` (see docs/backends.md
for every place a backend can live). The three classes are the lifecycle of Triton's
backend API: the backend once per process, the model once per model, the instance once
per instance.
"""

from __future__ import annotations

import numpy as np

from tritium.backend import Backend, BackendConfig, Instance, InstanceContext, Model, ModelContext


class ScaleInstance(Instance):
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def execute_batch(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        # Every request of the batch, stacked along the first dimension; tritium splits the result.
        return {"OUTPUT0": inputs["INPUT0"] * self.factor}


class ScaleModel(Model):
    def __init__(self, context: ModelContext, default_factor: float) -> None:
        # Model parameters from config.pbtxt win over the backend's default (--backend-config).
        self.factor = float(context.parameters.get("factor", default_factor))

    def create_instance(self, context: InstanceContext) -> Instance:
        return ScaleInstance(self.factor)


class TritiumBackend(Backend):
    name = "scale"

    def initialize(self, config: BackendConfig) -> None:
        super().initialize(config)
        self.default_factor = float(config.options.get("default-factor", "1"))

    def create_model(self, context: ModelContext) -> Model:
        return ScaleModel(context, self.default_factor)
