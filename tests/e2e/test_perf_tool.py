"""tritium perf as a user meets it: perf_analyzer's flags, exit codes, CSV, plot, HTTP and gRPC.

One server (add_sub, which batches up to 8, and a sequence model) serves every test. The
command runs in this process (click's runner: the same code, without a second interpreter
start per test) with short measurement windows; the first test runs it as a child process.
"""

from __future__ import annotations

import csv
import json
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.models import add_sub_model
from tests.servers import PROJECT_ROOT, TritiumServer, free_port
from tritium.cli import main

# The header the real perf_analyzer writes with -f (concurrency mode).
PERF_ANALYZER_HEADER = ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv",
                        "Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output",
                        "Client Recv", "p50 latency", "p90 latency", "p95 latency", "p99 latency"]
FAST = ["-p", "150", "-s", "100"]   # short windows; any three windows count as stable


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8, extra="dynamic_batching { }")
    shutil.copytree(Path(__file__).parent / "sequence_repo" / "py_accumulator", repo / "py_accumulator")
    running = TritiumServer(repo, "--allow-client-shm=true")
    yield running
    running.stop()


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def perf(*args: str) -> Finished:
    result = CliRunner(catch_exceptions=False).invoke(main, ["perf", *args])
    return Finished(result.exit_code, result.stdout, result.stderr)


def perf_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tritium.cli", "perf", *args], capture_output=True, text=True,
                          timeout=120, cwd=PROJECT_ROOT)


def one_line_error(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_stopped_server_is_exit_3_and_one_line(protocol):
    result = perf_process("-m", "add_sub", "-i", protocol, "-u", f"127.0.0.1:{free_port()}", *FAST)
    assert result.returncode == 3
    assert one_line_error(result).startswith(f"error: cannot reach the server at {protocol}://127.0.0.1:")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unknown_model_is_exit_4_with_the_servers_message(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.url
    result = perf("-m", "no_such_model", "-i", protocol, "-u", url, *FAST)
    assert result.returncode == 4
    assert one_line_error(result) == ("error: model 'no_such_model' is not available: "
                                      "Request for unknown model: 'no_such_model' is not found")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_rejected_requests_are_exit_5_with_the_servers_message(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.url
    result = perf("-m", "add_sub", "-i", protocol, "-u", url, "-b", "16", *FAST)
    assert result.returncode == 5
    line = one_line_error(result)
    assert line.startswith("error: concurrency 1: ")
    assert line.endswith("the server said: [request id: <id_unknown>] inference request batch-size must be <= 8 "
                         "for 'add_sub'")


def test_a_level_that_does_not_settle_is_exit_6(server):
    result = perf("-m", "add_sub", "-u", server.url, "-p", "50", "-s", "0.0001", "-r", "3")
    assert result.returncode == 6
    assert "no stable measurement within 3 windows" in one_line_error(result)


def test_csv_has_perf_analyzers_columns_and_the_plot_is_drawn(server, tmp_path):
    out, plot = tmp_path / "out.csv", tmp_path / "levels.png"
    result = perf("-m", "add_sub", "-u", server.url, "--concurrency-range", "1:2", "-f", str(out),
                  "--plot", str(plot), *FAST)
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(out.open()))
    assert rows[0] == PERF_ANALYZER_HEADER
    assert sorted(row[0] for row in rows[1:]) == ["1", "2"]
    throughputs = [float(row[1]) for row in rows[1:]]
    assert throughputs == sorted(throughputs) and throughputs[0] > 0   # sorted by throughput, as perf_analyzer
    for row in rows[1:]:
        p50, p90, p95, p99 = (int(v) for v in row[9:13])
        assert 0 < p50 <= p90 <= p95 <= p99
        assert int(row[6]) > 0   # server compute infer, from the statistics deltas
    # a progress line per level on stderr, the table on stdout
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["concurrency 1", "concurrency 2"]
    assert result.stdout.splitlines()[0].split()[:3] == ["concurrency", "infer/s", "p50"]
    from matplotlib.image import imread

    assert imread(str(plot)).shape[:2] == (450, 1200)


class RecordingProxy:
    """A TCP relay to the server that keeps every byte each way, to see what the tool sends."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sent: list[bytearray] = []       # per connection, what the tool sent
        self.received: list[bytearray] = []   # per connection, what the server answered
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            sent, received = bytearray(), bytearray()
            with self._lock:
                self.sent.append(sent)
                self.received.append(received)
            threading.Thread(target=self._relay, args=(client, upstream, sent), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, client, received), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, record: bytearray) -> None:
        with source, sink:
            try:
                while chunk := source.recv(65536):
                    with self._lock:
                        record.extend(chunk)
                    sink.sendall(chunk)
                sink.shutdown(socket.SHUT_WR)
            except OSError:   # the other direction closed both ends first
                pass

    def close(self) -> None:
        self._listener.close()


def test_http_requests_ask_for_uncompressed_answers_as_perf_analyzer_does(server):
    # aiohttp, under tritonclient, would offer gzip; the server then compresses every answer
    # and the run measures compression nobody asked for.
    proxy = RecordingProxy(server.url)
    try:
        result = perf("-m", "add_sub", "-u", proxy.url, "--concurrency-range", "2", "-q", *FAST)
    finally:
        proxy.close()
    assert result.returncode == 0, result.stderr
    with proxy._lock:
        sent = [bytes(data).lower() for data in proxy.sent]
        received = [bytes(data).lower() for data in proxy.received]
    requests = [head for data in sent for head in data.split(b"\r\n\r\n") if b"/infer http/1.1" in head]
    assert len(requests) > 10
    assert all(b"\r\naccept-encoding: identity\r\n" in head + b"\r\n" for head in requests)
    assert not any(b"content-encoding:" in data for data in received)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_both_protocols_measure_and_read_the_servers_breakdown(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.url
    result = perf("-m", "add_sub", "-i", protocol, "-u", url, "-b", "4", "--concurrency-range", "2", "--json",
                  "-q", *FAST)
    assert result.returncode == 0, result.stderr
    (level,) = json.loads(result.stdout)
    assert level["concurrency"] == 2 and level["windows"] >= 3
    assert level["inferences_per_s"] == pytest.approx(4 * level["throughput"])
    # the server's delta covers the measured windows: the same requests, give or take those in flight
    assert level["requests"] == pytest.approx(level["throughput"] * 3 * 0.150, rel=0.5)
    assert level["server"]["requests"] == pytest.approx(level["requests"], rel=0.25, abs=4)
    assert level["server"]["inferences"] >= 4 * level["server"]["requests"]
    assert level["server"]["compute_infer_us"] > 0


def test_request_rate_mode_sends_at_the_rate(server, tmp_path):
    out = tmp_path / "rate.csv"
    result = perf("-m", "add_sub", "-u", server.url, "--request-rate-range", "50:100:50", "-p", "400",
                  "-s", "100", "-f", str(out))
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["Request Rate"] + PERF_ANALYZER_HEADER[1:]
    assert {row[0]: float(row[1]) for row in rows[1:]} == {"50": pytest.approx(50, rel=0.2),
                                                           "100": pytest.approx(100, rel=0.2)}


def test_poisson_request_rate(server):
    result = perf("-m", "add_sub", "-u", server.url, "--request-rate-range", "80", "--request-distribution",
                  "poisson", "-p", "500", "-s", "100", "--json", "-q")
    assert result.returncode == 0, result.stderr
    (level,) = json.loads(result.stdout)
    assert level["request_rate"] == 80 and level["throughput"] == pytest.approx(80, rel=0.3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory_inputs(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.url
    result = perf("-m", "add_sub", "-i", protocol, "-u", url, "--shared-memory", "system", "--json", "-q", *FAST)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["server"]["requests"] > 0


def test_input_data_from_a_perf_analyzer_json_file(server, tmp_path):
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [
        {"INPUT0": [1.0] * 16, "INPUT1": {"content": [2.0] * 16, "shape": [16]}},
        {"INPUT0": [3.0] * 16, "INPUT1": [4.0] * 16}]}))
    ok = perf("-m", "add_sub", "-u", server.url, "--input-data", str(data), "-q", *FAST)
    assert ok.returncode == 0, ok.stderr
    data.write_text(json.dumps({"data": [{"INPUT0": [1.0] * 15, "INPUT1": [2.0] * 16}]}))
    short = perf("-m", "add_sub", "-u", server.url, "--input-data", str(data), *FAST)
    assert short.returncode == 2
    assert "input 'INPUT0' has 15 values, which do not fill shape [16]" in one_line_error(short)


def test_json_tensors(server):
    result = perf("-m", "add_sub", "-u", server.url, "--input-tensor-format", "json", "--json", "-q", *FAST)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["throughput"] > 0


@pytest.mark.parametrize("mode", [["--concurrency-range", "2"], ["--request-rate-range", "60"]])
def test_a_sequence_model_gets_ids_and_start_end_flags(server, mode):
    # the sequence batcher refuses a request whose sequence never started: success means the flags are right
    result = perf("-m", "py_accumulator", "-u", server.url, *mode, "--sequence-length", "5",
                  "--json", "-q", *FAST)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["server"]["requests"] > 0
