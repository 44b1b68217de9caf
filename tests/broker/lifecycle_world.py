"""A model lifecycle of its own for tests: a repository on disk, a registry and a scheduler, with the
messages it sends to agents and gateways recorded."""

from __future__ import annotations

import time


from tritium.broker.lifecycle import ControlSettings, ModelLifecycle
from tritium.broker.liveness import PeerLiveness
from tritium.broker.membership import Membership
from tritium.broker.registry import AgentRecord, InstanceRecord, Registry, VersionState
from tritium.broker.scheduler import Scheduler
from tritium.repo import ModelRepository
from tests.repo.helpers import PLAIN_PY_MODEL, write_model
from tritium.protocol import Placed, decode

CONFIG = """
backend: "python"
max_batch_size: {batch}
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }} ]
"""


class World:
    def __init__(self, root, load_retries: int = 0, more_roots: tuple = ()) -> None:
        self.root = root
        self.sent: list[dict] = []
        self.registry = Registry()
        self.registry.agents[b"agent"] = AgentRecord(b"agent", "host", (), None)
        scheduler = Scheduler(self.registry, self._record, self._record)
        self.membership = Membership(self.registry, scheduler, PeerLiveness(1.0))
        self.lifecycle = ModelLifecycle(self.registry, ModelRepository([root, *more_roots]), scheduler, self._record,
                                        ControlSettings(mode="explicit", load_retries=load_retries),
                                        self.membership)
        self.replies: list = []

    def _record(self, parts: list) -> None:
        self.sent.append(decode(parts[1])[0])

    def write(self, name: str = "m", batch: int = 8) -> None:
        write_model(self.root, name, CONFIG.format(batch=batch), {"1/model.py": PLAIN_PY_MODEL})

    def load(self, name: str = "m") -> None:
        self.lifecycle.load(name, {}, self.replies.append)
        self.finish_reads()

    def finish_reads(self) -> None:
        deadline = time.monotonic() + 20
        while self.lifecycle.reader.completed.empty():
            assert time.monotonic() < deadline, "the read did not finish"
            time.sleep(0.01)
        self.lifecycle.reader.run_completed()

    def loading(self, name: str = "m"):
        return next(v for v in self.registry.epochs.values() if v.name == name and v.state == VersionState.LOADING)

    def instance_ready(self, version) -> None:
        """What an agent and an instance say for one instance of ``version``."""
        self.lifecycle.placed(Placed(version.name, version.version, version.epoch, None, instances=["i0"]))
        iid = f"i-{version.epoch}".encode()
        instance = InstanceRecord(iid, b"agent", version.name, version.version, "i0", 2, epoch=version.epoch)
        self.registry.instances[iid] = instance
        version.instances.append(instance)
        self.lifecycle.instance_joined(version, "i0", b"agent")

    def table_config(self, name: str = "m") -> dict:
        return next(m for m in self.registry.table().models if m.name == name).config

    def kinds(self) -> list[int]:
        return [message["k"] for message in self.sent]
