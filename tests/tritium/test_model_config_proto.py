"""An instance process reads configs without importing the gRPC client, and shares its classes."""

from __future__ import annotations

import subprocess
import sys

from tests.servers import PROJECT_ROOT


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_instance_imports_neither_grpc_nor_asyncio():
    loaded = _run("import sys, tritium.workers.instance; "
                  "print(sorted(m for m in ('grpc', 'tritonclient.grpc', 'asyncio') if m in sys.modules))")
    assert loaded == "[]"


def test_the_grpc_client_imported_later_uses_the_same_config_classes():
    same = _run("from tritium.model_config_proto import model_config_pb2 as ours; "
                "import tritonclient.grpc as client; from tritonclient.grpc import service_pb2; "
                "print(client.model_config_pb2 is ours, "
                "type(service_pb2.ModelConfigResponse().config) is ours.ModelConfig)")
    assert same == "True True"
