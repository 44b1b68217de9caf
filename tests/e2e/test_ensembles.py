"""Ensembles through tritonclient, on a repository of Python models that real Triton also serves.

``ensemble_repo``: ``pipeline`` = pre -> (double, triple) -> combine, a fan-out and a
fan-in (SUM = 5 (IN + 1), DIFF = IN + 1; combine refuses negative values); ``outer``
nests ``pipeline`` and doubles its SUM; ``mixed`` sends a batching model's output to a
model that does not batch; ``probed`` ends in ``batch_probe``, which reports how many
rows its execution held. Expected texts and figures are what Triton 2.51 gives on the
same repository.
"""

from __future__ import annotations

import queue
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.metrics_text import scrape, value
from tests.servers import TritiumServer

MODELS = Path(__file__).parent / "ensemble_repo"
STEPS = ("pre", "double", "triple", "combine")
NEGATIVE_ERROR = "in ensemble 'pipeline', combine refuses negative values"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensembles")
    shutil.copytree(MODELS, root, dirs_exist_ok=True)
    return root


@pytest.fixture(scope="module")
def server(repo):
    with TritiumServer(repo) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


@pytest.fixture(scope="module")
def grpc(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def inputs(module, values: np.ndarray, name: str = "IN") -> list:
    tensor = module.InferInput(name, list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


def values(rows: int = 2, start: float = 0.0) -> np.ndarray:
    return (np.arange(rows * 4, dtype=np.float32) + start).reshape(rows, 4)


def fresh_client(server, protocol: str):
    """A client of its own for each thread (tritonclient.http's gevent pool stays in one thread)."""
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def infer_apart(server, protocol: str, model: str, given: np.ndarray, name: str = "IN"):
    module = httpclient if protocol == "http" else grpcclient
    return fresh_client(server, protocol).infer(model, inputs(module, given, name))


def stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fan_out_and_fan_in_give_every_output_by_value(http, grpc, protocol):
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    given = values()
    result = client.infer("pipeline", inputs(module, given))
    np.testing.assert_array_equal(result.as_numpy("SUM"), 5 * (given + 1))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), given + 1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_large_tensors_go_through_every_step(server, protocol):
    """Half a megabyte per tensor: external frames, passed from step to step without a copy."""
    given = values(2, start=3).repeat(16_384, axis=1)
    result = infer_apart(server, protocol, "outer", given, "VALUES")
    np.testing.assert_array_equal(result.as_numpy("OUT"), 10 * (given + 1))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), given + 1)


def test_the_response_names_the_ensemble_and_carries_its_sequence_parameters(http, grpc):
    response = http.infer("pipeline", inputs(httpclient, values(1))).get_response()
    assert (response["model_name"], response["model_version"]) == ("pipeline", "1")
    assert [o["name"] for o in response["outputs"]] == ["SUM", "DIFF"]
    assert response["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    message = grpc.infer("pipeline", inputs(grpcclient, values(1))).get_response()
    assert message.parameters["sequence_id"].int64_param == 0
    assert message.parameters["sequence_end"].bool_param is False


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_only_the_requested_outputs_are_returned(http, grpc, protocol):
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    given = values(3, start=1)
    result = client.infer("pipeline", inputs(module, given), outputs=[module.InferRequestedOutput("DIFF")])
    np.testing.assert_array_equal(result.as_numpy("DIFF"), given + 1)
    assert result.as_numpy("SUM") is None
    if protocol == "http":
        assert [o["name"] for o in result.get_response()["outputs"]] == ["DIFF"]
    else:
        assert [o.name for o in result.get_response().outputs] == ["DIFF"]


def test_statistics_of_the_ensemble_and_of_each_composing_model(http):
    before = {m: stats(http, m) for m in ("pipeline", *STEPS)}
    for _ in range(3):  # one at a time: each step runs alone, so the sums below are exact
        http.infer("pipeline", inputs(httpclient, values(2)))
    after = {m: stats(http, m) for m in ("pipeline", *STEPS)}

    def delta(model: str, *path: str) -> int:
        old, new = before[model], after[model]
        for key in path:
            old, new = old[key], new[key]
        return new - old

    for model in ("pipeline", *STEPS):
        assert delta(model, "inference_stats", "success", "count") == 3, model
        assert delta(model, "inference_stats", "queue", "count") == 3, model
        assert delta(model, "inference_count") == 6, model
        assert delta(model, "execution_count") == 3, model
        assert after[model]["inference_stats"]["fail"] == before[model]["inference_stats"]["fail"], model
    # As Triton: the ensemble's compute times are its steps' times added up, and each
    # ensemble request counts as one execution of its batch size.
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert delta("pipeline", "inference_stats", phase, "count") == 3
        assert delta("pipeline", "inference_stats", phase, "ns") == sum(
            delta(m, "inference_stats", phase, "ns") for m in STEPS), phase
    ensemble_batches = {b["batch_size"]: b for b in after["pipeline"]["batch_stats"]}
    assert ensemble_batches[2]["compute_infer"]["count"] >= 3
    assert after["pipeline"]["inference_stats"]["success"]["ns"] > \
        after["pipeline"]["inference_stats"]["compute_infer"]["ns"] > 0
    assert after["pipeline"]["last_inference"] > 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_step_fails_its_request_with_the_step_message_and_no_other(server, http, protocol):
    failed_before = stats(http, "pipeline")["inference_stats"]["fail"]["count"]
    good, bad = values(2), -values(2) - 5
    with ThreadPoolExecutor(4) as pool:
        goods = [pool.submit(infer_apart, server, protocol, "pipeline", good) for _ in range(3)]
        failing = pool.submit(infer_apart, server, protocol, "pipeline", bad)
        with pytest.raises(InferenceServerException) as caught:
            failing.result()
        for future in goods:
            np.testing.assert_array_equal(future.result().as_numpy("SUM"), 5 * (good + 1))
    assert caught.value.message() == NEGATIVE_ERROR
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert stats(http, "pipeline")["inference_stats"]["fail"]["count"] == failed_before + 1


def test_metrics_follow_the_ensemble_statistics(server, http):
    with pytest.raises(InferenceServerException):
        http.infer("pipeline", inputs(httpclient, -values(1) - 5))
    http.infer("pipeline", inputs(httpclient, values(1)))
    figures = stats(http, "pipeline")
    _, samples = scrape(server)
    labels = {"model": "pipeline", "version": "1"}
    assert value(samples, "nv_inference_request_success", **labels) == figures["inference_stats"]["success"]["count"]
    assert value(samples, "nv_inference_request_failure", **labels, reason="OTHER") == \
        figures["inference_stats"]["fail"]["count"] > 0
    assert value(samples, "nv_inference_exec_count", **labels) == figures["execution_count"]


def test_nested_ensemble(http, grpc):
    given = values(2, start=3)
    result = http.infer("outer", inputs(httpclient, given, "VALUES"))
    np.testing.assert_array_equal(result.as_numpy("OUT"), 10 * (given + 1))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), given + 1)
    result = grpc.infer("outer", inputs(grpcclient, given, "VALUES"), outputs=[grpcclient.InferRequestedOutput("OUT")])
    np.testing.assert_array_equal(result.as_numpy("OUT"), 10 * (given + 1))
    with pytest.raises(InferenceServerException) as caught:
        http.infer("outer", inputs(httpclient, -given - 9, "VALUES"))
    assert caught.value.message() == f"in ensemble 'outer', {NEGATIVE_ERROR}"
    assert caught.value.status() == "400"
    assert stats(http, "outer")["inference_stats"]["success"]["count"] >= 1


def test_a_step_batches_with_direct_traffic_to_its_model(server, http):
    """batch_probe waits up to a second for a second request: one from the ensemble, one direct."""
    row = values(1, start=7)
    with ThreadPoolExecutor(2) as pool:
        direct = pool.submit(infer_apart, server, "http", "batch_probe", row + 1, "X")
        through = pool.submit(infer_apart, server, "grpc", "probed", row)
        direct, through = direct.result(), through.result()
    np.testing.assert_array_equal(direct.as_numpy("ECHO"), row + 1)
    np.testing.assert_array_equal(through.as_numpy("ECHO"), row + 1)
    assert direct.as_numpy("ROWS").tolist() == [[2]]
    assert through.as_numpy("ROWS").tolist() == [[2]]
    assert {b["batch_size"] for b in stats(http, "batch_probe")["batch_stats"]} == {2}


def test_a_step_model_that_does_not_batch_gets_the_whole_tensor(http):
    given = values(3)
    result = http.infer("mixed", inputs(httpclient, given))
    np.testing.assert_array_equal(result.as_numpy("SCALED"), 10 * (given + 1))


def test_metadata_config_and_readiness_of_an_ensemble(http, grpc):
    assert http.is_model_ready("pipeline") and http.is_server_ready()
    metadata = http.get_model_metadata("pipeline")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "IN", "datatype": "FP32", "shape": [-1, -1]}]
    config = http.get_model_config("pipeline")
    assert config["instance_group"] == []
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == list(STEPS)
    assert grpc.get_model_metadata("outer").platform == "ensemble"
    index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
    assert index["pipeline"] == index["outer"] == "READY"


def test_requests_the_gateway_refuses_for_an_ensemble(http):
    with pytest.raises(InferenceServerException) as caught:
        http.infer("pipeline", inputs(httpclient, values(9)))
    assert caught.value.message() == "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'pipeline'"
    with pytest.raises(InferenceServerException) as caught:
        http.infer("pipeline", inputs(httpclient, values(1)), outputs=[httpclient.InferRequestedOutput("X")])
    assert caught.value.message() == "unexpected inference output 'X' for model 'pipeline'"


# -- a decoupled step ------------------------------------------------------------------------
# ``streamed`` = pre -> repeat -> double: repeat (decoupled) answers X[0, 0] times, Y = X + i.

def stream_answers(grpc, model: str, given: np.ndarray, **kwargs) -> list:
    """Every response of one streamed request, up to and with the final flag."""
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        grpc.async_stream_infer(model, inputs(grpcclient, given), enable_empty_final_response=True, **kwargs)
        collected = []
        while not collected or not collected[-1][0].get_response().parameters["triton_final_response"].bool_param:
            result, error = answers.get(timeout=30)
            assert error is None, str(error)
            collected.append((result, error))
        return [result for result, _ in collected]
    finally:
        grpc.stop_stream()


def test_a_decoupled_step_makes_the_ensemble_answer_once_per_response_then_the_final_flag(grpc):
    given = np.array([[2.0, 5.0]], np.float32)   # repeat sees [[3, 6]]: three responses
    results = stream_answers(grpc, "streamed", given, request_id="s-1")
    # The last answer carries the final flag, with outputs when no step was still running (as in Triton).
    data = [result for result in results if result.get_response().outputs]
    assert sorted(result.as_numpy("OUT").tolist() for result in data) == [[[6.0 + 2 * i, 12.0 + 2 * i]] for i in range(3)]
    assert [r.get_response().parameters["triton_final_response"].bool_param for r in results] == \
        [False] * (len(results) - 1) + [True]
    assert {r.get_response().id for r in results} == {"s-1"} and {r.get_response().model_name for r in results} == {"streamed"}
    (nothing,) = stream_answers(grpc, "streamed", np.array([[-1.0]], np.float32))   # repeat answers 0 times
    assert len(nothing.get_response().outputs) == 0


def test_an_ensemble_with_a_decoupled_step_is_decoupled(http, grpc):
    assert http.get_model_config("streamed")["model_transaction_policy"] == {"decoupled": True}
    assert http.get_model_config("pipeline")["model_transaction_policy"] == {"decoupled": False}
    with pytest.raises(InferenceServerException) as caught:   # one response per request only: refused, as from Triton
        grpc.infer("streamed", inputs(grpcclient, np.array([[1.0]], np.float32)))
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in caught.value.message()
    with pytest.raises(InferenceServerException) as caught:
        http.infer("streamed", inputs(httpclient, np.array([[1.0]], np.float32)))
    assert (caught.value.status(), caught.value.message()) == (
        "501", "HTTP end point doesn't support models with decoupled transaction policy")


# -- explicit model control ------------------------------------------------------------------

@pytest.fixture(scope="module")
def explicit_server(repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("explicit")
    shutil.copytree(repo, root, dirs_exist_ok=True)
    missing = (root / "pipeline" / "config.pbtxt").read_text().replace('"triple"', '"absent"')
    (root / "uses_missing").mkdir()
    (root / "uses_missing" / "1").mkdir()
    (root / "uses_missing" / "config.pbtxt").write_text(missing)
    with TritiumServer(root, "--model-control-mode=explicit") as running:
        yield running


@pytest.fixture(scope="module")
def explicit(explicit_server):
    return httpclient.InferenceServerClient(explicit_server.url, network_timeout=120)


def states(client) -> dict[str, str]:
    return {m["name"]: m["state"] for m in client.get_model_repository_index() if "state" in m}


def wait_for_states(client, expected: dict[str, str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while {name: states(client).get(name) for name in expected} != expected:
        assert time.monotonic() < deadline, states(client)
        time.sleep(0.1)


def test_loading_an_ensemble_loads_its_composing_models(explicit):
    assert states(explicit) == {}
    explicit.load_model("outer")
    assert states(explicit) == dict.fromkeys(["combine", "double", "outer", "pipeline", "pre", "triple"], "READY")
    result = explicit.infer("outer", inputs(httpclient, values(1), "VALUES"))
    np.testing.assert_array_equal(result.as_numpy("OUT"), 10 * (values(1) + 1))


def test_unloading_an_ensemble_keeps_its_models_unless_asked(explicit):
    explicit.load_model("outer")
    explicit.unload_model("outer")
    wait_for_states(explicit, {"outer": "UNAVAILABLE", "pipeline": "READY", "pre": "READY"})
    explicit.load_model("outer")
    explicit.unload_model("outer", unload_dependents=True)
    wait_for_states(explicit, dict.fromkeys(["combine", "double", "outer", "pipeline", "pre", "triple"],
                                            "UNAVAILABLE"))


def test_unload_dependents_keeps_models_another_ensemble_uses(explicit):
    explicit.load_model("pipeline")
    explicit.load_model("mixed")
    explicit.unload_model("pipeline", unload_dependents=True)
    wait_for_states(explicit, {"pipeline": "UNAVAILABLE", "combine": "UNAVAILABLE", "double": "UNAVAILABLE",
                               "triple": "UNAVAILABLE", "pre": "READY", "mixed": "READY",
                               "unbatched_scale": "READY"})


def test_unload_dependents_over_grpc(explicit, explicit_server):
    grpc_client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    grpc_client.unload_model("outer")
    explicit.load_model("pipeline")
    grpc_client.unload_model("pipeline", unload_dependents=True)
    wait_for_states(explicit, dict.fromkeys(["pipeline", "combine", "double", "triple"], "UNAVAILABLE"))


def test_unloading_a_composing_model_unloads_the_ensembles_using_it(explicit):
    explicit.load_model("outer")
    explicit.unload_model("double")
    wait_for_states(explicit, {"double": "UNAVAILABLE", "pipeline": "UNAVAILABLE", "outer": "UNAVAILABLE",
                               "triple": "READY", "pre": "READY"})
    assert not explicit.is_model_ready("pipeline")
    with pytest.raises(InferenceServerException) as caught:
        explicit.infer("pipeline", inputs(httpclient, values(1)))
    assert caught.value.message() == "Request for unknown model: 'pipeline' has no available versions"
    # outer uses double directly and through pipeline: both come back with it, as in Triton
    explicit.load_model("double")
    wait_for_states(explicit, dict.fromkeys(["double", "pipeline", "outer"], "READY"))
    result = explicit.infer("outer", inputs(httpclient, values(1), "VALUES"))
    np.testing.assert_array_equal(result.as_numpy("OUT"), 10 * (values(1) + 1))


def test_an_ensemble_with_a_missing_model_fails_to_load_naming_the_step(explicit):
    with pytest.raises(InferenceServerException) as caught:
        explicit.load_model("uses_missing")
    assert caught.value.message() == (
        "load failed for model 'uses_missing': ensemble 'uses_missing': step 2 (model 'absent') names "
        "model 'absent', which is not in the model repository")
    # As Triton 2.51 (side by side): such an ensemble never enters the lifecycle, indexed by name only
    assert {"name": "uses_missing"} in explicit.get_model_repository_index()
    assert "uses_missing" not in states(explicit)


def test_a_request_in_flight_when_its_step_model_is_unloaded_is_still_answered(explicit_server, explicit):
    explicit.load_model("probed")
    row = values(1, start=2)
    with ThreadPoolExecutor(1) as pool:
        # batch_probe holds the step up to a second, waiting for a second request.
        running = pool.submit(infer_apart, explicit_server, "http", "probed", row)
        time.sleep(0.3)
        explicit.unload_model("batch_probe")
        result = running.result()
    np.testing.assert_array_equal(result.as_numpy("ECHO"), row + 1)
    wait_for_states(explicit, {"batch_probe": "UNAVAILABLE", "probed": "UNAVAILABLE", "pre": "READY"})


def test_an_ensemble_named_at_startup_is_ready_with_its_models_when_the_server_is(repo):
    with TritiumServer(repo, "--model-control-mode=explicit", "--load-model=outer") as running:
        client = httpclient.InferenceServerClient(running.url)
        assert client.is_server_ready()
        assert states(client) == dict.fromkeys(["combine", "double", "outer", "pipeline", "pre", "triple"], "READY")
        result = client.infer("outer", inputs(httpclient, values(1), "VALUES"))
        np.testing.assert_array_equal(result.as_numpy("OUT"), 10 * (values(1) + 1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_model_s_error_reaches_the_client_without_the_request_id_as_from_triton(http, grpc, protocol):
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("pipeline", inputs(module, -values(1) - 5), request_id="abc")
    assert caught.value.message() == NEGATIVE_ERROR   # Triton 2.51 gives the same text, no "[request id: abc]"
