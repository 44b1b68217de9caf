"""ModelTable.resolve: which spec and version a request goes to, with Triton's errors (reference 1.3, 11)."""

from __future__ import annotations

import pytest

from tritium.gateway.model_table import ModelTable
from tritium.errors import InvalidArgument, NotFound, TritiumError, Unavailable
from tritium.protocol import ModelRow, Models, VersionRow

CONFIG = {"name": "m", "platform": "onnxruntime_onnx", "max_batch_size": 8,
          "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "O", "data_type": "TYPE_FP32", "dims": [4]}]}


def table(*models, ready=True) -> ModelTable:
    t = ModelTable()
    t.update(Models(7, models, ready, ()))
    return t


def model(name="m", versions=((1, "READY", ""),), config=True, error=None) -> ModelRow:
    return ModelRow(name, error, tuple(VersionRow(*v, True) for v in versions),
                    {**CONFIG, "name": name} if config else None, None)


def error_of(t: ModelTable, name: str, version: str | None) -> TritiumError:
    with pytest.raises(TritiumError) as info:
        t.resolve(name, version)
    return info.value


def test_update_records_the_table():
    t = table(model(), ready=False)
    assert t.received is True
    assert t.generation == 7
    assert t.server_ready is False
    assert list(t.models) == ["m"]
    assert t.models["m"].versions == {1: ("READY", "")}


def test_a_new_table_has_not_been_received():
    t = ModelTable()
    assert t.received is False
    assert t.models == {}


def test_unknown_model_is_404():
    error = error_of(table(model()), "nope", None)
    assert isinstance(error, NotFound)
    assert error.code.http_status == 404
    assert error.message == "Request for unknown model: 'nope' is not found"


def test_unknown_version_is_404():
    error = error_of(table(model()), "m", "3")
    assert isinstance(error, NotFound)
    assert error.code.http_status == 404
    assert error.message == "Request for unknown model: 'm' version 3 is not found"


def test_explicit_ready_version():
    t = table(model(versions=((1, "READY", ""), (2, "READY", ""))))
    spec, version = t.resolve("m", "1")
    assert version == 1
    assert spec.name == "m"


def test_latest_is_the_highest_ready_version():
    t = table(model(versions=((1, "READY", ""), (3, "READY", ""), (2, "READY", ""),
                              (5, "UNAVAILABLE", "failed"), (4, "LOADING", ""))))
    spec, version = t.resolve("m", None)
    assert version == 3
    assert spec.name == "m"
    assert t.resolve("m", "")[1] == 3
    assert t.get("m").ready_versions == (1, 2, 3)


def test_a_loading_version_is_not_at_ready_state_503():
    t = table(model(versions=((1, "READY", ""), (2, "LOADING", ""))))
    error = error_of(t, "m", "2")
    assert isinstance(error, Unavailable)
    assert error.code.http_status == 503
    assert error.message == "Request for unknown model: 'm' version 2 is not at ready state"


def test_a_model_still_loading_is_not_ready_400_for_latest():
    t = table(model(versions=((1, "LOADING", ""),)))
    error = error_of(t, "m", None)
    assert isinstance(error, InvalidArgument)
    assert error.message == "Model version not ready"


def test_a_failed_model_has_no_available_versions_404():
    t = table(model(versions=((1, "UNAVAILABLE", "load failed"),), config=False, error="load failed"))
    error = error_of(t, "m", None)
    assert isinstance(error, NotFound)
    assert error.code.http_status == 404
    assert error.message == "Request for unknown model: 'm' has no available versions"


def test_a_failed_explicit_version_is_not_at_ready_state():
    t = table(model(versions=((1, "READY", ""), (2, "UNAVAILABLE", "boom"))))
    error = error_of(t, "m", "2")
    assert error.message == "Request for unknown model: 'm' version 2 is not at ready state"


def test_a_model_without_versions_has_no_available_versions():
    t = table(model(versions=(), config=False))
    error = error_of(t, "m", None)
    assert isinstance(error, NotFound)
    assert error.message == "Request for unknown model: 'm' has no available versions"


def test_models_are_told_apart_by_name():
    t = table(model("a", versions=((1, "READY", ""),)), model("b", versions=((4, "READY", ""),)))
    assert t.resolve("a", None)[1] == 1
    assert t.resolve("b", None)[1] == 4
    assert t.resolve("b", None)[0].name == "b"


def test_an_update_replaces_the_whole_table():
    t = table(model("a"), model("b"))
    t.update(Models(8, (model("b"),), True, ()))
    assert t.generation == 8
    assert isinstance(error_of(t, "a", None), NotFound)
    assert t.resolve("b", None)[1] == 1


def test_a_config_with_an_unknown_data_type_costs_its_model_only():
    unreadable = ModelRow("bad", None, (VersionRow(1, "READY", "", True),),
                          {**CONFIG, "name": "bad", "input": [{"name": "A", "data_type": "TYPE_NOPE", "dims": [4]}]},
                          None)
    t = table(model("m"), unreadable)
    assert t.get("bad").spec is None
    assert t.get("bad").error == "the model table's tensor 'A' has no known data type ('TYPE_NOPE')"
    assert t.get("m").spec is not None


def test_the_startup_loads_settled_once_stays_so_when_a_new_broker_process_loads_again():
    """Non-strict readiness: Triton answers only once its startup loads settled, and a later
    table of a broker process taking over (its own loads in progress) does not take that back."""
    t = ModelTable()
    t.update(Models(1, (model(versions=((1, "LOADING", ""),)),), False, (), started=False))
    assert not t.started
    t.update(Models(2, (model(),), True, ()))
    assert t.started
    t.update(Models(1, (model(versions=((1, "LOADING", ""),)),), False, (), started=False))
    assert t.started
