"""``model_warmup``: requests an instance runs before it says hello, so no client pays for them.

Each warmup sample is ``count`` executions (at least one) of one request of ``batch_size``
with the inputs it describes: zeros, random values, or the bytes of a file in the
model's ``warmup/`` folder. It goes through the same executor as real batches; a sample
that fails makes the instance fail to initialize, as in Triton (the model is not ready
until its warmup succeeds).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from tritium.model_config_proto import model_config_pb2

from tritium.repo import ModelConfig
from tritium.datatypes import DataType, from_config_name, pack_bytes
from tritium.errors import InternalError
from tritium.protocol import Batch, Infer, pack_tensors, read_record

log = logging.getLogger(__name__)


def warm_up(executor, config: ModelConfig, model_dir: Path) -> int:
    """Run every warmup sample of ``config``; return how many executions ran."""
    executions = 0
    if config.model_warmup and (config.model_transaction_policy.decoupled or config.HasField("sequence_batching")):
        log.warning("model_warmup is not run for decoupled or sequence models in this tritium release")
        return 0
    for sample in config.model_warmup:
        frames = _sample_frames(config, model_dir, sample)
        for _ in range(max(1, sample.count)):
            done, _, _ = read_record(executor.run(list(frames))[0])
            if not all(done.ok):
                raise InternalError(f"warmup sample '{sample.name}' of model '{config.name}' failed")
            executions += 1
        log.info("warmup sample '%s': %d execution(s) of batch size %d", sample.name, max(1, sample.count),
                 max(1, sample.batch_size))
    return executions


def _sample_frames(config: ModelConfig, model_dir: Path, sample) -> list:
    batch = max(1, sample.batch_size)
    tensors = []
    for name, spec in sample.inputs.items():
        datatype = from_config_name(model_config_pb2.DataType.Name(spec.data_type))
        shape = ([batch] if config.max_batch_size > 0 else []) + list(spec.dims)
        tensors.append((name, datatype.name, shape, _input_bytes(spec, datatype, shape, model_dir / "warmup")))
    descriptors, inline, external = pack_tensors(tensors)
    infer = Infer(0, config.name, descriptors, batch_size=batch, external=len(external))
    return [Batch(0, 1).encode(), infer.encode(inline), *external]


def _input_bytes(spec, datatype: DataType, shape: list[int], folder: Path) -> bytes:
    count = int(np.prod(shape)) if shape else 1
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        return (folder / spec.input_data_file).read_bytes()
    if datatype.is_bytes:   # length-prefixed elements: empty ones, or short made-up ones
        return pack_bytes([b"" if source == "zero_data" else b"warmup"] * count)
    dtype = datatype.numpy or np.dtype("<u2")   # BF16: its bits
    if source == "random_data":
        values = np.random.default_rng(0).random(count) * 2 - 1 if dtype.kind == "f" else \
            np.random.default_rng(0).integers(0, 2, count)
        return values.astype(dtype).tobytes()
    return np.zeros(count, dtype=dtype).tobytes()
