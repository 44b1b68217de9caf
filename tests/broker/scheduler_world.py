"""A scheduler of its own for tests: a registry with one model, a fake clock, and lists that
record what it sends to instances and to gateways."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.broker.liveness import PeerLiveness
from tritium.broker.membership import Membership
from tritium.broker.registry import InstanceRecord, ModelRecord, ModelVersion, Registry, VersionState
from tritium.broker.scheduler import Scheduler
from tritium.repo.model import ModelDefinition
from tritium.protocol import BatchDone, Infer, Response, decode, read_record


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


def definition(text: str) -> ModelDefinition:
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return ModelDefinition("m", Path("/m"), config, config, ())


CONFIG = """
name: "m" max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def make_world(scheduling: str):
    registry = Registry()
    version = ModelVersion("m", 1, definition(CONFIG + scheduling), epoch=1)
    version.state = VersionState.READY
    record = ModelRecord("m")
    record.versions[1] = version
    registry.models["m"] = record
    registry.versions[version.key] = version
    registry.epochs[version.epoch] = version
    to_instances, to_gateways = [], []
    clock = Clock()
    scheduler = Scheduler(registry, to_instances.append, to_gateways.append, clock)
    return registry, version, scheduler, to_instances, to_gateways, clock


def add_instance(registry, version, name="i0", credit=2, passive=False):
    """An instance as the broker's membership adds one (a passive one draining for good)."""
    instance = InstanceRecord(name.encode(), b"agent", "m", 1, name, credit, epoch=version.epoch,
                              draining=passive, passive=passive)
    registry.instances[instance.iid] = instance
    version.instances.append(instance)
    version.passive_instances += passive
    return instance


def lose(scheduler, iid: bytes, why: str, restart_expected: bool = True) -> None:
    """An instance gone, as the broker's membership removes it."""
    Membership(scheduler.registry, scheduler, PeerLiveness(1.0)).remove_instance(iid, why, restart_expected)


def submit(scheduler, gateway: bytes, rid: int, batch_size: int = 1, model="m", version=1, request_id="",
           sequence_id=None, sequence_flags=0):
    record = Infer(rid, model, [["IN", "FP32", [batch_size, 4], 16 * batch_size, False]], version=version,
                   batch_size=batch_size, request_id=request_id or None, sequence_id=sequence_id,
                   sequence_flags=sequence_flags).encode([b"\0" * 16 * batch_size])
    scheduler.submit(gateway, record, read_record(record)[0], None)
    return record


def done(batch_number: int, rids: list[int], oks=None, timings=(10, 20, 30)) -> tuple[dict, list]:
    oks = oks or [True] * len(rids)
    responses = [Response(rid, []).encode() for rid in rids]
    return BatchDone(batch_number, oks, [0] * len(rids), tuple(timings)), responses


def sent_batch(parts: list) -> tuple[bytes, dict, list]:
    header, _, _ = decode(parts[1])
    return parts[0], header, [decode(p)[0]["rid"] for p in parts[2:]]


def error_of(parts: list) -> dict:
    return decode(parts[1])[0]["err"]
