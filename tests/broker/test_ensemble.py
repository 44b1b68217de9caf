"""The ensemble runner inside a real Scheduler, with sends recorded and instances played by the test.

No sockets: the test reads the BATCH messages the scheduler sends, computes what each
step model would answer, and hands the RESPONSE records back through ``batch_done``.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.broker.ensemble import STEP_CLIENT, EnsembleRunner, _reshaped
from tritium.broker.registry import InstanceRecord, ModelRecord, ModelVersion, Registry, VersionState
from tritium.broker.response_cache import ResponseCache
from tritium.broker.scheduler import Scheduler
from tests.broker.scheduler_world import lose
from tritium.repo.model import ModelDefinition
from tritium.repo.normalize import normalize
from tritium.shared_pool import SMALLEST_SLOT, AnswerSlots
from tritium.errors import ErrorCode, InvalidArgument, Unavailable
from tritium.protocol import (
    INLINE_LIMIT,
    BatchDone,
    Cancel,
    Infer,
    Kind,
    Response,
    ResponsePart,
    decode,
    pack_tensors,
    read_record,
    split_record,
    tensor_views,
)

GATEWAY = b"gw"


def model(name: str, inputs: str, outputs: str, max_batch_size: int = 8, extra: str = "") -> str:
    def tensors(names: str) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ -1 ] }}' for n in names.split())
    return (f'name: "{name}" max_batch_size: {max_batch_size} input [ {tensors(inputs)} ] '
            f'output [ {tensors(outputs)} ] {extra}')


def step(name: str, reads: dict, writes: dict, version: int = -1) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in reads.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in writes.items())
    return f'{{ model_name: "{name}" model_version: {version} {maps} }}'


def ensemble(name: str, inputs: str, outputs: str, steps: list[str], max_batch_size: int = 8) -> str:
    return model(name, inputs, outputs, max_batch_size,
                 f'platform: "ensemble" ensemble_scheduling {{ step [ {", ".join(steps)} ] }}')


# pre -> (double, triple) -> combine; X is both a step's input and an ensemble output.
PIPELINE = ensemble("pipeline", "IN", "SUM DIFF X", [
    step("pre", {"IN": "IN"}, {"X": "X"}),
    step("double", {"X": "X"}, {"Y": "doubled"}),
    step("triple", {"X": "X"}, {"Z": "tripled"}),
    step("combine", {"Y": "doubled", "Z": "tripled"}, {"SUM": "SUM", "DIFF": "DIFF"}),
])
OUTER = ensemble("outer", "V", "OUT", [
    step("pipeline", {"IN": "V"}, {"SUM": "inner"}),
    step("double", {"X": "inner"}, {"Y": "OUT"}),
])
FUNCTIONS = {
    "pre": lambda t: {"X": t["IN"] + 1},
    "double": lambda t: {"Y": t["X"] * 2},
    "triple": lambda t: {"Z": t["X"] * 3},
    "combine": lambda t: {"SUM": t["Y"] + t["Z"], "DIFF": t["Z"] - t["Y"]},
    "whole": lambda t: {"Y": t["X"] * 10},
    "silent": lambda t: {},
    "half": lambda t: {"Y": t["X"] * 2},   # its config says Y and Z
}
MODELS = [model("pre", "IN", "X"), model("double", "X", "Y"), model("triple", "X", "Z"),
          model("combine", "Y Z", "SUM DIFF"), PIPELINE, OUTER]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000
        self.tick = 0   # ns it moves on at each reading

    def __call__(self) -> int:
        self.now += self.tick
        return self.now


class World:
    """Registry, scheduler and one instance per model; ``run`` plays the instances."""

    def __init__(self, configs: list[str]) -> None:
        self.registry = Registry()
        self.to_instances: list[list] = []
        self.to_gateways: list[list] = []
        self.clock = Clock()
        self.scheduler = Scheduler(self.registry, self.to_instances.append, self.to_gateways.append, self.clock)
        self.versions = {}
        for text in configs:
            self.add(text)
        self.executed: list[tuple[str, int]] = []   # (model, batch size) per execution
        self.failing: dict[str, str] = {}           # model -> the error it answers with
        self.to_callers: list[list] = []            # answers to models' own requests (BLS)

    def add(self, text: str) -> ModelVersion:
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        normalize(config)
        version = ModelVersion(config.name, 1, ModelDefinition(config.name, Path("/m"), config, config, ()),
                               epoch=len(self.registry.epochs) + 1)
        version.state = VersionState.READY
        record = self.registry.models.setdefault(config.name, ModelRecord(config.name))
        record.versions[1] = version
        self.registry.versions[version.key] = version
        self.registry.epochs[version.epoch] = version
        if not version.ensemble:
            instance = InstanceRecord(f"i-{config.name}".encode(), b"agent", config.name, 1, config.name, 4,
                                      epoch=version.epoch)
            self.registry.instances[instance.iid] = instance
            version.instances.append(instance)
        self.versions[config.name] = version
        return version

    def infer(self, name: str, tensors: dict[str, np.ndarray], rid: int = 1, outputs=None, **fields) -> None:
        descriptors, inline, external = pack_tensors((n, "FP32", list(a.shape), a.tobytes()) for n, a in tensors.items())
        infer = Infer(rid, name, descriptors, version=1, batch_size=next(iter(tensors.values())).shape[0],
                      outputs=outputs, external=len(external), **fields)
        self.scheduler.submit(GATEWAY, infer.encode(inline), infer, external or None)

    def batches(self) -> list[tuple[bytes, int, list]]:
        """The BATCH messages sent since the last call: (instance, batch number, [(header, arrays, frames)])."""
        sent, self.to_instances[:] = list(self.to_instances), []
        batches = []
        for parts in sent:
            batch = decode(parts[1])[0]
            if batch["k"] != Kind.BATCH:
                self.to_callers.append(parts)
                continue
            requests, position = [], 2
            for _ in range(batch["n"]):
                header, view, offset = decode(parts[position])
                frames = parts[position + 1:position + 1 + header.get("x", 0)]
                views = tensor_views(header["inputs"], view, offset, frames)
                arrays = {d[0]: np.frombuffer(v, np.float32).reshape(d[2]) for d, v in zip(header["inputs"], views)}
                requests.append((header, arrays, frames))
                position += 1 + header.get("x", 0)
            batches.append((parts[0], batch["b"], requests))
        return batches

    def run(self, rounds: int | None = None, timings=(1, 2, 3), in_turns: bool = False) -> None:
        """Answer every batch sent, and what that sends, until nothing is left (or for ``rounds``).

        ``in_turns``: each round's answers inside one ``Scheduler.turn``, as the broker reads them.
        """
        for _ in range(rounds or 10):
            batches = self.batches()
            if not batches:
                return
            with self.scheduler.turn() if in_turns else contextlib.nullcontext():
                self._answer_all(batches, timings)
        if rounds is None:
            raise AssertionError("the ensemble kept sending batches")

    def _answer_all(self, batches: list, timings) -> None:
        for iid, number, requests in batches:
            name = self.registry.instances[iid].model
            self.executed.append((name, sum(h["bs"] for h, _, _ in requests)))
            records, counts, oks = [], [], []
            for header, arrays, _ in requests:
                reply = self.answer(name, header, arrays)
                records.extend(reply)
                counts.append(len(reply) - 1)
                oks.append(read_record(reply[0])[0].error is None)
            self.scheduler.batch_done(iid, BatchDone(number, oks, counts, tuple(timings)), records)

    def answer(self, name: str, header: dict, arrays: dict) -> list:
        if name in self.failing:
            return [Response(header["rid"], error=InvalidArgument(self.failing[name])).encode()]
        results = FUNCTIONS[name](arrays)
        wanted = [n for n in header.get("outputs") or list(results) if n in results]
        descriptors, inline, external = pack_tensors(
            (n, "FP32", list(results[n].shape), results[n].astype(np.float32).tobytes()) for n in wanted)
        return [Response(header["rid"], descriptors, external=len(external)).encode(inline), *external]

    def answers(self) -> list[tuple[dict, dict]]:
        """What the gateway got: (header, outputs by name) per RESPONSE record."""
        found = []
        for parts in self.to_gateways:
            assert parts[0] == GATEWAY
            header, view, offset = decode(parts[1])
            views = tensor_views(header.get("outputs", []), view, offset, parts[2:])
            found.append((header, {d[0]: np.frombuffer(v, np.float32).reshape(d[2])
                                   for d, v in zip(header.get("outputs", []), views)}))
        return found


@pytest.fixture
def world():
    return World(MODELS)


def values(rows: int = 2, width: int = 4) -> np.ndarray:
    return np.arange(rows * width, dtype=np.float32).reshape(rows, width)


def test_steps_start_when_their_inputs_exist_and_the_answer_has_every_output(world):
    world.infer("pipeline", {"IN": values()}, rid=41)
    assert [decode(parts[2])[0]["m"] for parts in world.to_instances] == ["pre"]
    world.run()
    assert [name for name, _ in world.executed] == ["pre", "double", "triple", "combine"]
    (header, outputs), = world.answers()
    assert header["rid"] == 41 and [d[0] for d in header["outputs"]] == ["SUM", "DIFF", "X"]
    np.testing.assert_array_equal(outputs["SUM"], 5 * (values() + 1))
    np.testing.assert_array_equal(outputs["DIFF"], values() + 1)
    np.testing.assert_array_equal(outputs["X"], values() + 1)
    assert header["params"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    assert not world.scheduler.ensembles.busy and world.scheduler.idle()


def test_a_step_request_is_never_counted_as_leaving_its_queue_before_it_came():
    """An ensemble whose two steps run one model: the second step's request, submitted while the
    first step's batch is handled, leaves in the batch the model's queue sends at the end of that
    handling; its queue time counts from its arrival to then, never below 0."""
    world = World(MODELS + [ensemble("twice", "IN", "OUT", [step("double", {"X": "IN"}, {"Y": "MID"}),
                                                            step("double", {"X": "MID"}, {"Y": "OUT"})])])
    world.clock.tick = 1_000
    world.infer("twice", {"IN": values()})
    world.run(in_turns=True)
    (_, outputs), = world.answers()
    np.testing.assert_array_equal(outputs["OUT"], values() * 4)
    queue = world.versions["double"].stats.queue
    assert queue.count == 2 and queue.ns >= 0


def test_the_ensemble_requests_of_one_turn_run_each_step_as_one_batch():
    # The broker reads a gateway's message of three requests in one turn, and the answers of
    # a step's batch in one turn: each dynamically batching step model gets one batch of
    # three, not one alone (its instance idle) and the others after it.
    batching = "dynamic_batching { }"
    world = World([model("pre", "IN", "X", extra=batching), model("double", "X", "Y", extra=batching),
                   model("triple", "X", "Z", extra=batching), model("combine", "Y Z", "SUM DIFF", extra=batching),
                   PIPELINE])
    with world.scheduler.turn():
        for rid in (1, 2, 3):
            world.infer("pipeline", {"IN": values(1) + rid}, rid=rid)
        assert world.to_instances == []   # nothing leaves before the turn ends
    world.run(in_turns=True)
    assert world.executed == [("pre", 3), ("double", 3), ("triple", 3), ("combine", 3)]
    answers = {header["rid"]: outputs for header, outputs in world.answers()}
    for rid in (1, 2, 3):
        np.testing.assert_array_equal(answers[rid]["SUM"], 5 * (values(1) + rid + 1))


def test_a_turn_inside_a_turn_leaves_the_dispatching_to_the_outer_one():
    world = World([model("pre", "IN", "X", extra="dynamic_batching { }"), model("double", "X", "Y"),
                   model("triple", "X", "Z"), model("combine", "Y Z", "SUM DIFF"), PIPELINE])
    with world.scheduler.turn():
        world.infer("pipeline", {"IN": values(1)}, rid=1)
        with world.scheduler.turn():
            world.infer("pipeline", {"IN": values(1)}, rid=2)
        assert world.to_instances == []
        world.infer("pipeline", {"IN": values(1)}, rid=3)
    world.run(rounds=1)
    assert world.executed == [("pre", 3)]


def test_outside_a_turn_each_request_leaves_at_once():
    world = World([model("pre", "IN", "X", extra="dynamic_batching { }"), model("double", "X", "Y"),
                   model("triple", "X", "Z"), model("combine", "Y Z", "SUM DIFF"), PIPELINE])
    for rid in (1, 2, 3):
        world.infer("pipeline", {"IN": values(1)}, rid=rid)
    world.run()
    # the first alone, to the idle instance; the two that queued behind it together
    assert [size for name, size in world.executed if name == "pre"] == [1, 2]


def test_only_the_steps_the_requested_outputs_need_run(world):
    world.infer("pipeline", {"IN": values()}, outputs=["X"])
    world.run()
    assert world.executed == [("pre", 2)]
    (header, outputs), = world.answers()
    assert list(outputs) == ["X"]


def test_each_step_is_asked_only_for_the_outputs_that_are_needed(world):
    world.infer("pipeline", {"IN": values()}, outputs=["DIFF", "X"])
    world.run(rounds=1)  # pre
    double, triple = [reqs[0][0] for _, _, reqs in world.batches()]
    assert (double["m"], double["outputs"], triple["m"], triple["outputs"]) == ("double", ["Y"], "triple", ["Z"])


def test_large_tensors_pass_from_step_to_step_as_the_same_frames(world):
    big = np.ones((2, INLINE_LIMIT), dtype=np.float32)   # each row over the inline limit
    world.infer("pipeline", {"IN": big}, outputs=["SUM"])
    world.run(rounds=1)
    batches = world.batches()
    frames = [frames for _, _, reqs in batches for _, _, frames in reqs]
    assert len(frames) == 2 and all(len(f) == 1 for f in frames)
    assert frames[0][0] is frames[1][0]   # X went to double and to triple as one frame, not copied


def test_a_step_output_in_an_instance_s_answer_pool_is_copied_and_its_slot_released(world):
    """A slot of an answer pool may be handed on once only, and X feeds two steps and the answer."""
    slots = AnswerSlots(4 << 20)
    plain = world.answer
    world.answer = lambda name, header, arrays: slots.place(plain(name, header, arrays))
    big = np.ones((2, INLINE_LIMIT), dtype=np.float32)
    world.infer("pipeline", {"IN": big}, outputs=["SUM", "X"])
    world.run(rounds=1)                    # pre answered, X in its pool
    frames = [frames for _, _, reqs in world.batches() for _, _, frames in reqs]
    assert len(frames) == 2 and all(type(f[0]) is bytes for f in frames)   # double and triple got copies
    gc.collect()
    assert not any(slots.pool.pool.view[offset // SMALLEST_SLOT] for offset in slots.pool._sizes)


def test_inline_outputs_of_a_step_s_record_in_an_answer_pool_are_copied(world):
    """Inline tensors adding up past 64 KiB put the record itself in the pool: X (kept for the
    answer while the other steps run) must not be a slice of a slot the instance reuses."""
    slots = AnswerSlots(4 << 20)
    plain = world.answer
    world.answer = lambda name, header, arrays: slots.place([b"done", *plain(name, header, arrays)])[1:]
    big = np.ones((1, (INLINE_LIMIT - 4) // 4), dtype=np.float32)   # X inline, its record over 64 KiB
    world.infer("pipeline", {"IN": big}, outputs=["SUM", "X"])
    world.run(rounds=1)                    # pre answered, its record in the pool
    gc.collect()
    slots.place([b"done", np.zeros(INLINE_LIMIT, np.uint8)])   # the instance reuses whatever was released
    world.run()
    (header, outputs), = world.answers()
    np.testing.assert_array_equal(outputs["X"], big + 1)


def _recording(answer, seen: list):
    def record(name, header, arrays):
        reply = answer(name, header, arrays)
        seen.append(reply)
        return reply
    return record


def test_the_answer_forwards_an_external_output_frame_untouched(world):
    big = np.ones((1, INLINE_LIMIT // 2), dtype=np.float32)
    world.infer("pipeline", {"IN": big}, outputs=["X"])
    sent = []
    world.answer = _recording(world.answer, sent)
    world.run()
    (reply,), ((parts),) = sent, world.to_gateways
    assert parts[2] is reply[1]
    np.testing.assert_array_equal(world.answers()[0][1]["X"], big + 1)


def test_a_failing_step_answers_once_with_the_step_message_and_later_results_are_dropped(world):
    world.failing["double"] = "double refuses"
    world.infer("pipeline", {"IN": values()}, rid=5)
    world.run()
    (header, _), = world.answers()
    assert header["rid"] == 5
    assert header["err"] == {"code": int(ErrorCode.INVALID_ARG), "message": "in ensemble 'pipeline', double refuses"}
    assert ("triple", 2) in world.executed and ("combine", 2) not in world.executed
    stats = world.versions["pipeline"].stats.as_dict("pipeline", 1)["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (0, 1)
    assert not world.scheduler.ensembles.busy


def test_a_step_model_that_is_not_loaded_fails_the_request_at_once(world):
    del world.registry.versions[("triple", 1)]   # unloaded
    world.registry.models["triple"].versions.clear()
    world.infer("pipeline", {"IN": values()})
    world.run()
    (header, _), = world.answers()
    assert header["err"]["code"] == int(ErrorCode.NOT_FOUND)
    assert header["err"]["message"] == "in ensemble 'pipeline', Request for unknown model: 'triple' has no " \
                                       "available versions"


def test_a_step_whose_instance_is_lost_twice_fails_the_request(world):
    world.infer("pipeline", {"IN": values()})
    assert world.batches()
    lose(world.scheduler, b"i-pre", "was killed by signal 9")
    world.to_instances.clear()
    world.registry.instances[b"i-pre2"] = InstanceRecord(b"i-pre2", b"agent", "pre", 1, "pre_1", 1, epoch=1)
    world.versions["pre"].instances.append(world.registry.instances[b"i-pre2"])
    world.scheduler.instance_ready(world.registry.instances[b"i-pre2"])
    assert world.batches()   # run once more elsewhere
    lose(world.scheduler, b"i-pre2", "was killed by signal 9")
    (header, _), = world.answers()
    assert header["err"]["code"] == int(ErrorCode.UNAVAILABLE)
    assert header["err"]["message"].startswith("in ensemble 'pipeline', instance 'pre_1' of model 'pre'")
    assert not world.scheduler.ensembles.busy


def test_shutdown_answers_every_ensemble_request(world):
    world.infer("pipeline", {"IN": values()}, rid=1)
    world.infer("outer", {"V": values()}, rid=2)
    world.scheduler.fail_everything(Unavailable("the server is shutting down"))
    assert sorted(h["rid"] for h, _ in world.answers()) == [1, 2]
    assert all("err" in h for h, _ in world.answers())


def test_a_nested_ensemble_runs_its_inner_ensemble_as_a_step(world):
    world.infer("outer", {"V": values()})
    world.run()
    (header, outputs), = world.answers()
    np.testing.assert_array_equal(outputs["OUT"], 10 * (values() + 1))
    assert [name for name, _ in world.executed] == ["pre", "double", "triple", "combine", "double"]
    inner = world.versions["pipeline"].stats.as_dict("pipeline", 1)
    outer = world.versions["outer"].stats.as_dict("outer", 1)
    assert inner["inference_stats"]["success"]["count"] == outer["inference_stats"]["success"]["count"] == 1
    # Every step ran alone with timings (1, 2, 3): the inner adds four, the outer five.
    assert inner["inference_stats"]["compute_infer"]["ns"] == 4 * 2
    assert outer["inference_stats"]["compute_infer"]["ns"] == 5 * 2
    assert outer["batch_stats"] == [{"batch_size": 2, "compute_input": {"count": 1, "ns": 5},
                                     "compute_infer": {"count": 1, "ns": 10},
                                     "compute_output": {"count": 1, "ns": 15}}]
    assert outer["execution_count"] == 1 and outer["inference_count"] == 2


def test_a_failing_inner_step_names_both_ensembles(world):
    world.failing["combine"] = "combine refuses"
    world.infer("outer", {"V": values()})
    world.run()
    (header, _), = world.answers()
    assert header["err"]["message"] == "in ensemble 'outer', in ensemble 'pipeline', combine refuses"


def test_ensemble_steps_batch_with_direct_requests_to_their_model():
    world = World([model("pre", "IN", "X"),
                   model("double", "X", "Y", extra="dynamic_batching { max_queue_delay_microseconds: 1000 }"),
                   ensemble("e", "IN", "Y", [step("pre", {"IN": "IN"}, {"X": "x"}),
                                             step("double", {"X": "x"}, {"Y": "Y"})])])
    world.infer("e", {"IN": values(1)}, rid=1)
    world.run(rounds=1)   # pre; double's step now waits in double's queue
    world.infer("double", {"X": values(3)}, rid=2)
    world.clock.now += 1_000_000
    world.scheduler.run_due()
    world.run()
    assert world.executed == [("pre", 1), ("double", 4)]
    answers = {h["rid"]: o for h, o in world.answers()}
    np.testing.assert_array_equal(answers[1]["Y"], 2 * (values(1) + 1))
    np.testing.assert_array_equal(answers[2]["Y"], 2 * values(3))


def test_a_step_model_that_does_not_batch_gets_the_whole_tensor():
    world = World([model("pre", "IN", "X"), model("whole", "X", "Y", max_batch_size=0),
                   ensemble("e", "IN", "Y", [step("pre", {"IN": "IN"}, {"X": "x"}),
                                             step("whole", {"X": "x"}, {"Y": "Y"})])])
    world.infer("e", {"IN": values(3)})
    world.run()
    assert world.executed == [("pre", 3), ("whole", 1)]
    (_, outputs), = world.answers()
    np.testing.assert_array_equal(outputs["Y"], 10 * (values(3) + 1))


def test_an_output_a_step_leaves_out_is_left_out_of_the_answer_as_in_triton(world):
    world.add(model("silent", "X", "Y"))
    world.add(ensemble("e", "IN", "Y", [step("pre", {"IN": "IN"}, {"X": "x"}),
                                        step("silent", {"X": "x"}, {"Y": "Y"})]))
    world.answer = _without_outputs(world.answer)
    world.infer("e", {"IN": values()})
    world.run()
    (header, outputs), = world.answers()
    assert "err" not in header and outputs == {}   # (before: Triton's deadlock error, which 2.51 does not give)


def test_an_ensemble_answers_with_the_outputs_its_steps_gave(world):
    world.add(model("half", "X", "Y Z"))
    world.add(ensemble("e", "IN", "Y Z", [step("pre", {"IN": "IN"}, {"X": "x"}),
                                          step("half", {"X": "x"}, {"Y": "Y", "Z": "Z"})]))
    world.infer("e", {"IN": values()})
    world.run()
    (header, outputs), = world.answers()
    assert "err" not in header and list(outputs) == ["Y"]
    np.testing.assert_array_equal(outputs["Y"], (values() + 1) * 2)


def _without_outputs(answer):
    def reply(name, header, arrays):
        if name != "silent":
            return answer(name, header, arrays)
        return [Response(header["rid"], []).encode()]
    return reply


def test_a_step_whose_required_input_another_step_left_out_fails_the_request_with_tritons_words(world):
    world.add(model("half", "X", "Y Z"))
    world.add(model("join", "Y Z", "W"))
    world.add(ensemble("e", "IN", "W", [step("pre", {"IN": "IN"}, {"X": "x"}),
                                        step("half", {"X": "x"}, {"Y": "y", "Z": "z"}),
                                        step("join", {"Y": "y", "Z": "z"}, {"W": "W"})]))
    world.infer("e", {"IN": values()})
    world.run()
    (header, _), = world.answers()
    assert header["err"]["message"] == (
        "in ensemble 'e', expected 2 inputs but got 1 inputs for model 'join'. Got input(s) ['Y'], but missing "
        "required input(s) ['Z']. Please provide all required input(s).")
    assert [name for name, _ in world.executed] == ["pre", "half"]   # join never ran


def test_an_unknown_requested_output_is_refused(world):
    world.infer("pipeline", {"IN": values()}, outputs=["NOPE"])
    (header, _), = world.answers()
    assert header["err"]["message"] == "unexpected inference output 'NOPE' for model 'pipeline'"


def test_the_first_unknown_output_the_request_names_is_the_one_refused(world):
    """What a request set of outputs needs is remembered per set: the error still follows each
    request's own order."""
    world.infer("pipeline", {"IN": values()}, outputs=["NOPE", "NADA"])
    world.infer("pipeline", {"IN": values()}, outputs=["NADA", "NOPE"])
    messages = [header["err"]["message"] for header, _ in world.answers()]
    assert messages == ["unexpected inference output 'NOPE' for model 'pipeline'",
                        "unexpected inference output 'NADA' for model 'pipeline'"]


def test_ensemble_health_follows_its_models(world):
    assert world.registry.healthy(world.versions["outer"])
    world.versions["triple"].instances[0].healthy = False
    assert not world.registry.healthy(world.versions["pipeline"])
    assert not world.registry.healthy(world.versions["outer"])
    assert not world.registry.server_ready()


@pytest.mark.parametrize("shape, batch_size, batching, dims, expected", [
    ([2, 4], 2, True, [4], [2, 4]),          # batching on both sides: as it is
    ([4], 0, True, [4], [1, 4]),             # to a batching model from one that does not: a batch of one
    ([3, 4], 0, True, [4], [3, 4]),          # ... unless it already looks batched
    ([1, 4], 1, False, [4], [4]),            # a batch of one to a model that does not batch: stripped
    ([2, 4], 2, False, [-1, 4], [2, 4]),     # a batch that fits the non-batching dims: whole
    ([2, 4], 2, False, [4], [2, 4]),         # a larger batch that does not fit: left for the model to refuse
])
def test_shapes_between_batching_and_non_batching_models(shape, batch_size, batching, dims, expected):
    assert _reshaped(shape, batch_size, batching, dims) == expected


def test_a_model_calling_an_ensemble_gets_the_answer_on_its_own_socket(world):
    """BLS: the request comes from an instance, and the answer goes back to it, not to a gateway."""
    array = values(1)
    infer = Infer(9, "pipeline", [["IN", "FP32", [1, 4], 16, False]], version=-1, outputs=["SUM"])
    world.scheduler.submit(b"i-caller/bls", infer.encode([array.tobytes()]), infer, None, from_backend=True)
    world.run()
    (parts,) = world.to_callers
    assert world.to_gateways == [] and parts[0] == b"i-caller/bls"
    answer, _, _ = decode(parts[1])
    assert (answer["k"], answer["rid"], [d[0] for d in answer["outputs"]]) == (Kind.RESPONSE, 9, ["SUM"])


def _split_answers_twice(world: World, iid: bytes, number: int, rid: int, given: np.ndarray) -> None:
    """The decoupled ``split`` answers its request twice (S = IN, then IN + 1), then the final flag."""
    for i in range(2):
        descriptors, inline, _ = pack_tensors([("S", "FP32", [1, 4], (given + i).tobytes())])
        world.scheduler.streams.response_part(iid, ResponsePart(number, 0),
                                              [Response(rid, descriptors, final=False).encode(inline)])
    world.scheduler.streams.response_part(iid, ResponsePart(number, 0), [Response(rid, final=True, empty=True).encode()])
    world.scheduler.batch_done(iid, BatchDone(number, [True], [], (1, 2, 3), still_open=[]), [])


def test_a_decoupled_step_runs_the_steps_after_it_once_per_response_and_pairs_their_outputs():
    """split answers twice (S = IN, then IN + 1); double and triple run for each answer and are
    answered out of order; combine must pair the Y and Z of the same answer (SUM = 5 S, DIFF = S)."""
    split = model("split", "IN", "S", extra="model_transaction_policy { decoupled: true }")
    fanned = ensemble("fanned", "IN", "SUM DIFF", [
        step("split", {"IN": "IN"}, {"S": "s"}), step("double", {"X": "s"}, {"Y": "y"}),
        step("triple", {"X": "s"}, {"Z": "z"}), step("combine", {"Y": "y", "Z": "z"}, {"SUM": "SUM", "DIFF": "DIFF"}),
    ]).replace('platform: "ensemble"', 'platform: "ensemble" model_transaction_policy { decoupled: true }')
    world = World([*MODELS, split, fanned])
    given = values(1)
    world.infer("fanned", {"IN": given})
    ((iid, number, [(header, _, _)]),) = world.batches()
    _split_answers_twice(world, iid, number, header["rid"], given)
    steps = world.batches()
    assert sorted(world.registry.instances[i].model for i, _, _ in steps) == ["double", "double", "triple", "triple"]
    def order(batch) -> tuple:   # double for the first answer, triple for the second, then the others
        name, i = world.registry.instances[batch[0]].model, int(batch[2][0][1]["X"][0, 0] - given[0, 0])
        return (0, 1) if (name, i) == ("double", 0) else (1, 0) if (name, i) == ("triple", 1) else (2, name)
    world._answer_all(sorted(steps, key=order), (1, 2, 3))
    world.run()
    answers = world.answers()
    assert [header.get("final") for header, _ in answers] == [False, True]
    sums = sorted(outputs["SUM"].tolist() for _, outputs in answers)
    assert sums == [(5 * (given + i)).tolist() for i in range(2)]
    for _, outputs in answers:
        np.testing.assert_array_equal(outputs["SUM"], 5 * outputs["DIFF"])
    assert not world.scheduler.ensembles.busy


def _double_answered_at_once(world: World) -> EnsembleRunner:
    """The world's ensemble runner, its steps on ``double`` answered inside their submit, as a
    response-cache hit answers them."""
    runner = world.scheduler.ensembles
    submit = runner._submit

    def cached_double(client, record, header, frames, from_backend):
        if header.model != "double":
            return submit(client, record, header, frames, from_backend)
        descriptors, inline, _ = pack_tensors([("Y", "FP32", [1, 4], np.zeros((1, 4), np.float32).tobytes())])
        runner.answered([STEP_CLIENT, Response(header.rid, descriptors).encode(inline)])

    runner._submit = cached_double
    return runner


def test_an_iteration_completed_by_a_step_answered_at_once_is_answered_once():
    """A step answered inside its submit (a response-cache hit) completes the iteration before
    the step that started it has finished its own bookkeeping: one answer, not two."""
    split = model("split", "IN", "S", extra="model_transaction_policy { decoupled: true }")
    fanned = ensemble("pair", "IN", "X Y", [
        step("split", {"IN": "IN"}, {"S": "s"}), step("pre", {"IN": "s"}, {"X": "X"}), step("double", {"X": "X"}, {"Y": "Y"}),
    ]).replace('platform: "ensemble"', 'platform: "ensemble" model_transaction_policy { decoupled: true }')
    world = World([*MODELS, split, fanned])
    _double_answered_at_once(world)
    given = values(1)
    world.infer("pair", {"IN": given})
    ((iid, number, [(header, _, _)]),) = world.batches()
    descriptors, inline, _ = pack_tensors([("S", "FP32", [1, 4], given.tobytes())])
    world.scheduler.streams.response_part(iid, ResponsePart(number, 0),
                                          [Response(header["rid"], descriptors, final=False).encode(inline)])
    world.run()
    assert [sorted(outputs) for _, outputs in world.answers()] == [["X", "Y"]]


@pytest.mark.parametrize("decoupled", [False, True])
def test_a_step_answered_at_once_does_not_end_the_request_before_its_sibling_starts(decoupled):
    """Two steps read the ensemble's input; the first answers inside its submit (a response-cache
    hit) while the second is not started yet: the request is not over, and both outputs come."""
    parallel = ensemble("par", "IN", "Y Z", [step("double", {"X": "IN"}, {"Y": "Y"}),
                                             step("triple", {"X": "IN"}, {"Z": "Z"})])
    if decoupled:
        parallel = parallel.replace('platform: "ensemble"',
                                    'platform: "ensemble" model_transaction_policy { decoupled: true }')
    world = World([*MODELS, parallel])
    runner = _double_answered_at_once(world)
    given = values(1)
    world.infer("par", {"IN": given})
    world.run()
    answers = [(header, outputs) for header, outputs in world.answers() if outputs]
    assert [sorted(outputs) for _, outputs in answers] == [["Y", "Z"]]
    np.testing.assert_array_equal(answers[0][1]["Z"], 3 * given)
    assert all("err" not in header for header, _ in world.answers())
    assert not runner.busy


def _chain_world(decoupled: bool = True) -> World:
    """The ensemble ``chain``: split (decoupled) -> double; the ensemble decoupled too, or not."""
    split = model("split", "IN", "S", extra="model_transaction_policy { decoupled: true }")
    chain = ensemble("chain", "IN", "OUT", [step("split", {"IN": "IN"}, {"S": "s"}),
                                           step("double", {"X": "s"}, {"Y": "OUT"})])
    if decoupled:
        chain = chain.replace('platform: "ensemble"', 'platform: "ensemble" model_transaction_policy { decoupled: true }')
    return World([*MODELS, split, chain])


def _decoupled_chain() -> tuple[World, bytes, int]:
    """``chain`` after split has sent one answer and its final flag, its batch still executing:
    (world, split's instance, its batch number)."""
    world = _chain_world()
    given = values(1)
    world.infer("chain", {"IN": given})
    ((iid, number, [(header, _, _)]),) = world.batches()
    descriptors, inline, _ = pack_tensors([("S", "FP32", [1, 4], given.tobytes())])
    for response in (Response(header["rid"], descriptors, final=False).encode(inline),
                     Response(header["rid"], final=True, empty=True).encode()):
        world.scheduler.streams.response_part(iid, ResponsePart(number, 0), [response])
    world.run()   # double runs with timings (1, 2, 3), and the ensemble answers
    return world, iid, number


def _compute_ns(world: World, name: str) -> tuple[int, list[int]]:
    stats = world.versions[name].stats.as_dict(name, 1)["inference_stats"]
    return stats["success"]["count"], [stats[k]["ns"] for k in ("compute_input", "compute_infer", "compute_output")]


def test_a_decoupled_steps_compute_times_count_in_its_ensemble_once_its_batch_is_done():
    """A decoupled step answers while it executes, so its compute times come after its answers
    (with BATCH_DONE); the ensemble's statistics wait for them, as Triton counts an ensemble
    request once every step request is released."""
    world, iid, number = _decoupled_chain()
    (header, outputs), = world.answers()
    assert header.get("final") is True and list(outputs) == ["OUT"]
    assert _compute_ns(world, "chain") == (0, [0, 0, 0])
    world.scheduler.batch_done(iid, BatchDone(number, [True], [], (10, 20, 30), still_open=[]), [])
    assert _compute_ns(world, "chain") == (1, [11, 22, 33])
    assert world.scheduler.ensembles._executing == {}


def test_a_decoupled_step_lost_after_its_final_answer_still_lets_its_ensemble_be_counted():
    world, iid, _ = _decoupled_chain()
    lose(world.scheduler, iid, "exited")
    assert _compute_ns(world, "chain") == (1, [1, 2, 3])   # double's times only
    assert world.scheduler.ensembles._executing == {}


def test_an_ensemble_failing_while_its_decoupled_step_executes_is_counted_once_as_a_failure():
    world = _chain_world()
    world.infer("chain", {"IN": values(1)})
    ((iid, number, [(header, _, _)]),) = world.batches()
    world.scheduler.streams.response_part(iid, ResponsePart(number, 0), [
        Response(header["rid"], error=InvalidArgument("no"), final=True).encode()])
    world.scheduler.batch_done(iid, BatchDone(number, [False], [], (10, 20, 30), still_open=[]), [])
    stats = world.versions["chain"].stats.as_dict("chain", 1)["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"], stats["compute_infer"]["ns"]) == (0, 1, 0)
    assert world.scheduler.ensembles._executing == {}


def test_a_decoupled_step_lost_before_its_final_flag_still_lets_its_answered_ensemble_be_counted():
    """An ensemble that is not decoupled is answered by its decoupled step's first response; the
    step's instance is lost before the step's final flag and BATCH_DONE: the answered ensemble
    still counts as a success (without the lost step's times), and nothing waits for them."""
    world = _chain_world(decoupled=False)
    given = values(1)
    world.infer("chain", {"IN": given})
    ((iid, number, [(header, _, _)]),) = world.batches()
    descriptors, inline, _ = pack_tensors([("S", "FP32", [1, 4], given.tobytes())])
    world.scheduler.streams.response_part(iid, ResponsePart(number, 0),
                                          [Response(header["rid"], descriptors, final=False).encode(inline)])
    world.run()   # double runs with timings (1, 2, 3), and the ensemble answers
    (answer, outputs), = world.answers()
    assert answer.get("error") is None and list(outputs) == ["OUT"]
    assert _compute_ns(world, "chain") == (0, [0, 0, 0])
    lose(world.scheduler, iid, "exited")
    assert _compute_ns(world, "chain") == (1, [1, 2, 3])
    assert world.scheduler.ensembles._executing == {}
    assert len(world.answers()) == 1   # the step's loss answers nobody again


# -- a client gives up ----------------------------------------------------------------------------

def _cancelled_at_once(world: World, rid: int) -> None:
    world.scheduler.cancel(GATEWAY, Cancel(rid, "pipeline", 1))
    (header, _), = world.answers()
    assert (header["rid"], header["err"]) == (rid, {"code": int(ErrorCode.CANCELLED),
                                                    "message": "the client cancelled the request"})
    assert world.versions["pipeline"].stats.failures == {"OTHER": 1}   # an ensemble's failures are OTHER, as in Triton


def test_a_cancelled_ensemble_request_is_answered_at_once_and_its_running_step_s_instance_told(world):
    world.infer("pipeline", {"IN": values()}, rid=41)
    (step_batch,) = [parts for parts in world.to_instances]
    _cancelled_at_once(world, 41)
    told = [parts for parts in world.to_instances if decode(parts[1])[0]["k"] == Kind.CANCEL_RUNNING]
    assert [parts[0] for parts in told] == [b"i-pre/hb", b"i-pre"]
    assert decode(told[0][1])[0]["b"] == decode(step_batch[1])[0]["b"]
    world.run()
    assert [name for name, _ in world.executed] == ["pre"]   # its answer is dropped: no step follows
    assert len(world.to_gateways) == 1 and not world.scheduler.ensembles.busy and world.scheduler.idle()


def test_a_cancelled_ensemble_request_s_queued_step_leaves_its_model_s_queue():
    world = World([model("pre", "IN", "X", extra="dynamic_batching { }"), *MODELS[1:]])
    world.infer("pre", {"IN": values()}, rid=7)        # the one instance of pre is busy with it
    world.infer("pipeline", {"IN": values()}, rid=41)   # its first step waits in pre's queue
    assert len(world.scheduler.registry.versions[("pre", 1)].batcher) == 1
    world.to_gateways.clear()
    _cancelled_at_once(world, 41)
    assert len(world.scheduler.registry.versions[("pre", 1)].batcher) == 0
    assert world.versions["pre"].stats.failures == {"CANCELED": 1}
    world.run()
    assert world.executed == [("pre", len(values()))]   # only the request that was running
    assert world.scheduler.idle()


# -- max_inflight_requests ------------------------------------------------------------------------

LIMITED = PIPELINE.replace("ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 1", 1)


def _requests_out_per_round(world: World) -> list[list[str]]:
    """Play the instances round by round: per round, the step model of each request sent."""
    rounds = []
    for _ in range(30):
        batches = world.batches()
        if not batches:
            return rounds
        rounds.append(sorted(world.registry.instances[iid].model for iid, _, requests in batches for _ in requests))
        world._answer_all(batches, (1, 2, 3))
    raise AssertionError("the ensemble kept sending batches")


def test_max_inflight_requests_holds_each_steps_requests_out_across_requests_to_the_limit():
    world = World([*MODELS[:4], LIMITED])
    for rid in (1, 2, 3):
        world.infer("pipeline", {"IN": values() + rid}, rid=rid)
    rounds = _requests_out_per_round(world)
    assert rounds[0] == ["pre"], "one request of each step out at a time, whatever its ensemble request"
    assert all(len(models) == len(set(models)) for models in rounds), rounds
    answers = {header["rid"]: outputs for header, outputs in world.answers()}
    assert sorted(answers) == [1, 2, 3]
    for rid, outputs in answers.items():
        np.testing.assert_array_equal(outputs["SUM"], 5 * (values() + rid + 1))
    assert not world.scheduler.ensembles.busy and world.scheduler.idle()


def test_without_max_inflight_requests_every_ready_step_goes_out_at_once():
    world = World(MODELS)
    for rid in (1, 2, 3):
        world.infer("pipeline", {"IN": values() + rid}, rid=rid)
    assert _requests_out_per_round(world)[0] == ["pre"] * 3


def test_a_request_waiting_for_room_at_a_step_is_cancelled_at_once_and_the_others_go_on():
    world = World([*MODELS[:4], LIMITED])
    world.infer("pipeline", {"IN": values()}, rid=1)
    world.infer("pipeline", {"IN": values()}, rid=41)   # its first step waits for rid 1's
    _cancelled_at_once(world, 41)
    world.run()
    assert [header["rid"] for header, _ in world.answers()] == [41, 1]
    assert [name for name, _ in world.executed] == ["pre", "double", "triple", "combine"]
    assert not world.scheduler.ensembles.busy and world.scheduler.idle()


def test_a_failed_step_request_makes_room_for_the_next_one_waiting():
    world = World([*MODELS[:4], LIMITED])
    world.failing["pre"] = "no"
    world.infer("pipeline", {"IN": values()}, rid=1)
    world.infer("pipeline", {"IN": values()}, rid=2)
    world.run()
    assert sorted(header["rid"] for header, _ in world.answers()) == [1, 2]
    assert all("err" in header for header, _ in world.answers())
    assert not world.scheduler.ensembles.busy and world.scheduler.idle()


# -- traced at level TENSORS ------------------------------------------------------------------------

def test_a_traced_decoupled_step_is_one_child_trace_with_the_outputs_of_every_response():
    world = _chain_world()
    given = values(1)
    descriptors, inline, _ = pack_tensors([("IN", "FP32", [1, 4], given.tobytes())])
    infer = Infer(1, "chain", descriptors, version=1, batch_size=1, trace=bytes(24), trace_tensors=True)
    world.scheduler.submit(GATEWAY, infer.encode(inline), infer, None)
    ((iid, number, [(header, _, _)]),) = world.batches()
    assert header["tt"] is True, "its step requests are traced with tensors too"
    _split_answers_twice(world, iid, number, header["rid"], given)
    world.run()
    (final,) = [h for h, _ in world.answers() if h.get("final")]
    steps = {step["m"]: [] for step in final["tr"]["steps"]}
    for step in final["tr"]["steps"]:
        steps[step["m"]].append(step)
    (split,) = steps["split"]
    assert split["inputs"] == [["IN", "FP32", [1, 4], given.tobytes()]]
    assert split["outputs"] == [["S", "FP32", [1, 4], (given + i).tobytes()] for i in range(2)]
    assert [step["inputs"][0][3] for step in steps["double"]] == [(given + i).tobytes() for i in range(2)]


def test_a_traced_ensemble_request_that_fails_keeps_the_steps_that_ran_in_its_trace(world):
    world.failing["double"] = "no"
    descriptors, inline, _ = pack_tensors([("IN", "FP32", [2, 4], values().tobytes())])
    infer = Infer(5, "pipeline", descriptors, version=1, batch_size=2, trace=bytes(24))
    world.scheduler.submit(GATEWAY, infer.encode(inline), infer, None)
    world.run()
    ((header, _),) = world.answers()
    assert header["err"]["message"] == "in ensemble 'pipeline', no"
    assert sorted(step["m"] for step in header["tr"]["steps"]) == ["double", "pre", "triple"]


def _steps_answered_at_once(world: World) -> None:
    """From now on every step request is answered inside its submit, as a response-cache hit is."""
    runner = world.scheduler.ensembles

    def at_once(client, record, header, frames, from_backend):
        view, offset = split_record(record)
        arrays = {d[0]: np.frombuffer(v, np.float32).reshape(d[2])
                  for d, v in zip(header.inputs, tensor_views(header.inputs, view, offset, frames or []))}
        runner.answered([STEP_CLIENT, *world.answer(header.model, {"rid": header.rid, "outputs": header.outputs},
                                                    arrays)])

    runner._submit = at_once


def test_many_starts_waiting_for_room_and_answered_at_once_are_released_without_nesting():
    world = World([*MODELS[:4], LIMITED])
    world.infer("pipeline", {"IN": values()}, rid=1)   # its first step out: the next 400 wait for it
    for rid in range(2, 402):
        world.infer("pipeline", {"IN": values() + rid}, rid=rid)
    _steps_answered_at_once(world)
    world.run()
    answers = {header["rid"]: outputs for header, outputs in world.answers()}
    assert sorted(answers) == list(range(1, 402))
    np.testing.assert_array_equal(answers[401]["SUM"], 5 * (values() + 402))
    assert not world.scheduler.ensembles.busy


def test_a_decoupled_ensemble_does_not_end_while_a_start_waits_for_room():
    """split answers twice: double runs for the first answer while the second waits for room; the
    first answer is not the last, and the second is answered too."""
    split = model("split", "IN", "S", extra="model_transaction_policy { decoupled: true }")
    chain = ensemble("chain", "IN", "OUT", [step("split", {"IN": "IN"}, {"S": "s"}),
                                           step("double", {"X": "s"}, {"Y": "OUT"})])
    chain = chain.replace('platform: "ensemble"', 'platform: "ensemble" model_transaction_policy { decoupled: true }')
    world = World([*MODELS, split, chain.replace("ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 1")])
    given = values(1)
    world.infer("chain", {"IN": given})
    ((iid, number, [(header, _, _)]),) = world.batches()
    _split_answers_twice(world, iid, number, header["rid"], given)
    world.run()
    answers = world.answers()
    assert [h.get("final") for h, _ in answers] == [False, True]   # the second answer is the last
    assert sorted(o["OUT"].tolist() for _, o in answers) == [(2 * (given + i)).tolist() for i in range(2)]
    assert not world.scheduler.ensembles.busy


def test_a_broker_forced_to_exit_answers_a_request_waiting_for_room():
    world = World([*MODELS[:4], LIMITED])
    world.infer("pipeline", {"IN": values()}, rid=1)
    world.infer("pipeline", {"IN": values()}, rid=2)   # waits for rid 1's first step
    assert len(world.batches()) == 1
    world.scheduler.fail_everything(Unavailable("exiting"))
    assert sorted(h["rid"] for h, _ in world.answers()) == [1, 2]
    assert not world.batches(), "nothing new is sent to an instance"
    assert not world.scheduler.ensembles.busy


# -- the response cache --------------------------------------------------------------------------

def caching_world() -> World:
    cached = ensemble("cached", "X", "Y", [step("double", {"X": "X"}, {"Y": "Y"})]) + " response_cache { enable: true }"
    world = World(MODELS + [cached])
    world.scheduler.cache = ResponseCache(1 << 20)
    return world


def test_an_ensemble_that_caches_answers_a_repeated_request_without_its_steps_and_without_the_first_trace():
    world = caching_world()
    world.infer("cached", {"X": values()}, rid=1, trace=bytes(24))
    world.run()
    world.infer("cached", {"X": values()}, rid=2)
    world.run()
    assert world.executed == [("double", 2)]
    (first, outputs), (again, repeated) = world.answers()
    assert (first["rid"], again["rid"]) == (1, 2)
    assert "tr" in first and "tr" not in again   # the first asker's trace is its own
    np.testing.assert_array_equal(repeated["Y"], values() * 2)
    np.testing.assert_array_equal(outputs["Y"], repeated["Y"])
    stats = world.versions["cached"].stats
    assert (stats.cache_hit.count, stats.cache_miss.count, stats.success.count) == (1, 1, 2)


def test_an_ensemble_request_with_a_sequence_is_neither_answered_from_the_cache_nor_kept():
    world = caching_world()
    for rid, sequence in ((1, 5), (2, 7), (3, 0), (4, 9)):
        world.infer("cached", {"X": values()}, rid=rid, sequence_id=sequence or None, sequence_flags=1 if sequence else 0)
        world.run()
    assert len(world.executed) == 4   # each ran its step: 1, 2 and 4 carry sequences, 3 came first
    assert [header["params"]["sequence_id"] for header, _ in world.answers()] == [5, 7, 0, 9]
    world.infer("cached", {"X": values()}, rid=5)
    world.run()
    assert len(world.executed) == 4   # answered from 3's entry


def test_an_ensemble_request_with_sequence_flags_alone_is_neither_answered_from_the_cache_nor_kept():
    world = caching_world()
    world.infer("cached", {"X": values()}, rid=1, sequence_flags=1)
    world.run()
    world.infer("cached", {"X": values()}, rid=2)
    world.run()
    world.infer("cached", {"X": values()}, rid=3, sequence_flags=2)
    world.run()
    assert len(world.executed) == 3
    assert [header["params"]["sequence_start"] for header, _ in world.answers()] == [True, False, False]
    assert [header["params"]["sequence_end"] for header, _ in world.answers()] == [False, False, True]


def test_reloading_a_model_an_ensemble_runs_starts_the_ensemble_s_cached_answers_afresh():
    world = caching_world()
    world.infer("cached", {"X": values()}, rid=1)
    world.run()
    world.add(model("double", "X", "Y"))   # a reload: a new load of the step's model
    world.infer("cached", {"X": values()}, rid=2)
    world.run()
    assert world.executed == [("double", 2), ("double", 2)]
