"""Every message kind has one type, and each type's wire form is the compact header its peers read."""

from __future__ import annotations

import pytest

from tritium.errors import InternalError, InvalidArgument, NotFound, ProtocolError, Unavailable
from tritium.protocol import (
    Cancel,
    CancelRunning,
    MetricsAsk,
    MESSAGES,
    PROTOCOL_VERSION,
    Assign,
    Assignment,
    Batch,
    BatchDone,
    CONTROL_ARGS,
    ChangeLogSettings,
    Control,
    ControlOp,
    ControlReply,
    Drain,
    Drained,
    Heartbeat,
    Hello,
    HostMetrics,
    IndexQuery,
    Infer,
    InstanceExited,
    InstanceFailed,
    InstanceHealth,
    Kind,
    LoadModel,
    LoadRef,
    LogSettings,
    ModelRow,
    Models,
    ModelsQuery,
    Placed,
    Refused,
    RegisterRegion,
    Reset,
    Response,
    ResponsePart,
    Role,
    RunningInstance,
    Scale,
    ScaledAssignment,
    SharedMemoryRegion,
    StatsQuery,
    StatusQuery,
    TraceDone,
    TraceSettingsQuery,
    Unassign,
    UnloadModel,
    UnregisterRegion,
    VersionRow,
    decode,
    read_record,
)

DESCRIPTOR = ["X", "FP32", [1, 4], 16, False]
ASSIGNMENT = Assignment("m", 1, 7, {"name": "m"}, files={"config.pbtxt": b"x"}, identity="load-1", adopt=("h/m_0",))

# One of every kind, every field given a value other than its default.
EXAMPLES = [
    Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=1.0, host="h", gpus=(0, 1), models=("m",), cpu_slots=4,
          running=(RunningInstance("h/m_0", "m", 1, "load-1", "m_0", "m_0", "CPU", 0, 2, False, 123),),
          agent="agent-1", model="m", version=1, epoch=7, boot=99, name="m_0", instance_kind="GPU", credit=2),
    Refused("protocol version 5 refused"),
    Reset(boot=99, epoch=7),
    Heartbeat(99, 1.0, Role.GATEWAY, PROTOCOL_VERSION, "h/m_0", "agent-1", True),
    Infer(3, "m", [DESCRIPTOR], version=1, batch_size=2, request_id="r", outputs=["Y"], params={"p": 1},
          sequence_id="s", sequence_flags=1, external=1),
    Response(3, [DESCRIPTOR], params={"p": 1}, error=NotFound("no such model"), final=False,
             empty=True, external=2),
    Cancel(3, "m", 2),
    CancelRunning(5, 1),
    MetricsAsk(3),
    Batch(5, 2, [0, 1]),
    BatchDone(5, [True, False], [1, 0], (1, 2, 3), [0]),
    ResponsePart(5, 1),
    Control(9, LoadModel("m", {"config": "{}", "file:1/model.onnx": b"\x00\x01"})),
    ControlReply(9, {"loaded": True}, InvalidArgument("bad")),
    Models(4, (ModelRow("m", "failed", (VersionRow(1, "READY", "", True),), {"name": "m"}, {"Y": ["a"]}),), True,
           (SharedMemoryRegion("r", "/key", 0, 64),)),
    LogSettings({"log_verbose_level": 1}),
    Assign((ASSIGNMENT,), (ScaledAssignment(ASSIGNMENT, 2),), True),
    Unassign((LoadRef("m", 1, 7),)),
    Scale(ASSIGNMENT, 3, ("m_1",)),
    Placed("m", 1, 7, 99, instances=["m_0"], adopted={"m_0": "h/m_0"}, error=Unavailable("no room")),
    InstanceFailed("m", 1, 7, "m_0", 99, "agent-1", "CPU", 1.0, InternalError("import failed")),
    InstanceExited("h/m_0", "exited with status 1", 1, 7, "m_0", True, 99),
    InstanceHealth(False),
    HostMetrics("h", 0.5, 1000, 500, [{"uuid": "GPU-1"}]),
    Drain(),
    Drained(),
]


def test_every_kind_has_exactly_one_type():
    assert sorted(MESSAGES) == sorted(int(kind) for kind in Kind)
    assert sorted(example.kind for example in EXAMPLES) == sorted(Kind)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: type(e).__name__)
def test_every_type_crosses_a_record_and_reads_back_equal(example):
    header, _, _ = decode(example.encode())
    assert header["k"] == example.kind
    assert type(example).from_wire(header) == example or getattr(example, "error", None) is not None
    back = read_record(example.encode())[0]
    assert type(back) is type(example)
    assert back.to_wire() == example.to_wire()
    if getattr(example, "error", None) is None:   # errors compare by identity
        assert back == example


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: type(e).__name__)
def test_types_are_frozen_and_slotted(example):
    assert not hasattr(example, "__dict__")
    for name in example.__struct_fields__[:1]:
        with pytest.raises(AttributeError):
            setattr(example, name, None)


def test_a_field_at_its_default_is_left_off_the_wire_and_reads_back_as_the_default():
    infer = Infer(1, "m", [DESCRIPTOR])
    assert infer.to_wire() == {"k": Kind.INFER, "rid": 1, "m": "m", "inputs": [DESCRIPTOR]}
    assert Infer.from_wire({"k": 10, "rid": 1, "m": "m", "inputs": []}).sequence_flags == 0
    assert Response(1).to_wire() == {"k": Kind.RESPONSE, "rid": 1}
    assert Assign((ASSIGNMENT,)).to_wire() == {"k": Kind.ASSIGN, "models": [ASSIGNMENT.to_wire()]}


def test_the_hot_kinds_keep_their_short_keys():
    """The hot kinds' compact wire form: short keys, every field at its default left off."""
    infer = Infer(3, "m", [DESCRIPTOR], version=1, batch_size=2, request_id="r", outputs=["Y"], params={"p": 1},
                  sequence_id=5, sequence_flags=3, external=1)
    assert infer.to_wire() == {"k": 10, "rid": 3, "m": "m", "v": 1, "bs": 2, "id": "r", "outputs": ["Y"],
                               "params": {"p": 1}, "cid": 5, "sf": 3, "x": 1, "inputs": [DESCRIPTOR]}
    assert Batch(5, 2).to_wire() == {"k": 20, "b": 5, "n": 2}
    assert BatchDone(5, [True], [0], (1, 2, 3)).to_wire() == {"k": 21, "b": 5, "ok": [True], "rx": [0], "t": [1, 2, 3]}
    assert ResponsePart(5, 1).to_wire() == {"k": 22, "b": 5, "i": 1}
    assert Response(3, [DESCRIPTOR], external=1).to_wire() == {"k": 11, "rid": 3, "outputs": [DESCRIPTOR], "x": 1}
    assert Response(3, error=InternalError("boom"), final=True).to_wire() == {
        "k": 11, "rid": 3, "err": {"code": 2, "message": "boom"}, "final": True}


def test_every_control_operation_has_one_record_and_crosses_whole():
    assert sorted(args.__struct_config__.tag for args in CONTROL_ARGS) == sorted(op.value for op in ControlOp)
    examples = [ModelsQuery(), StatsQuery("m", 2), StatusQuery(), IndexQuery(ready=True),
                LoadModel("m", {"config": "{}"}), UnloadModel("m", unload_dependents=True),
                ChangeLogSettings({"log_verbose_level": 1}), RegisterRegion("r", "/k", 8, 64), UnregisterRegion(),
                TraceSettingsQuery("m", {"trace_rate": "5"}, {"mode": "triton"}),
                TraceDone("m", [{"id": 1, "timestamps": []}], None)]
    assert {type(args) for args in examples} == set(CONTROL_ARGS)
    for number, args in enumerate(examples):
        message, _, _ = read_record(Control(number, args).encode())
        assert message == Control(number, args) and message.op is args.op


def test_errors_cross_as_code_and_message():
    reply = ControlReply.from_wire({"k": 31, "rid": 1, "err": {"code": 3, "message": "gone"}})
    assert isinstance(reply.error, NotFound) and reply.error.message == "gone"


def test_a_malformed_record_is_a_protocol_error_naming_the_field():
    assert Control.from_wire({"k": 30, "rid": 1, "args": {"op": "status"}}).op is ControlOp.STATUS
    with pytest.raises(ProtocolError, match=r"malformed Control record: Invalid value 'reboot' - at `\$.args.op`"):
        Control.from_wire({"k": 30, "rid": 1, "args": {"op": "reboot"}})
    with pytest.raises(ProtocolError, match=r"Object missing required field `model` - at `\$.args`"):
        Control.from_wire({"k": 30, "rid": 1, "args": {"op": "load"}})
    with pytest.raises(ProtocolError, match=r"Expected `int`, got `str` - at `\$.b`"):
        Batch.from_wire({"k": 20, "b": "one", "n": 1})


def test_the_model_table_rows_are_positional_on_the_wire():
    row = VersionRow(2, "LOADING", "", False)
    assert row.to_wire() == [2, "LOADING", "", False]
    assert VersionRow.from_wire([2, "LOADING", "", False]) == row


def test_a_missing_required_field_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="missing required field `n`"):
        Batch.from_wire({"k": 20, "b": 1})
