"""Model repositories in Google Cloud Storage and Azure Storage, served as Triton serves them
(``--model-repository gs://bucket/path``, ``as://account/container/path``): the servers read a
real GCS server (an emulator of its JSON API, named as for Triton by
``CLOUD_STORAGE_EMULATOR_ENDPOINT``) and a real Azure blob service (Azurite, named by tritium's
``TRITIUM_AZURE_BLOB_ENDPOINT``, the account's key in Azure's variables), both on loopback;
polling follows the bucket. What the stores share (the host's copy, loads, worker hosts) is
tested with S3 in tests/e2e/test_s3_repository.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.azure_server import azure_server
from tests.e2e.test_s3_repository import ENSEMBLE, failed_start, infer, polling_follows, put_model
from tests.gcs_server import gcs_server
from tests.servers import TritiumServer

# What a start from a bucket that does not exist says after "cannot be read: ", by store.
MISSING = {"gs": "cannot list gs://no-such-bucket/models/: 404 ",
           "as": "cannot list as://devstoreaccount1/no-such-bucket/models/: The specified container does not exist. "
                 "(ContainerNotFound)"}


@pytest.fixture(scope="module", params=["gs", "as"])
def store(request):
    serving = gcs_server if request.param == "gs" else azure_server
    with pytest.MonkeyPatch.context() as patch, serving("models") as server:
        for name, value in server.environment.items():   # the servers started here read them
            patch.setenv(name, value)
        server.scheme = request.param
        yield server


def test_polling_follows_the_bucket_and_an_ensemble_s_folder_marker_is_its_version(store):
    put_model(store, "poll", "twice", factor=2)
    store.put("models", "poll/ens/config.pbtxt", ENSEMBLE)
    store.put("models", "poll/ens/1/", "")   # the empty version folder, as the consoles make it
    with TritiumServer(store.location("models", "poll"), "--model-control-mode", "poll",
                       "--repository-poll-secs", "1") as server:
        assert infer(server.url, "ens") == [2.0, 4.0]
        polling_follows(store, server.url, "poll", "twice")
        assert infer(server.url, "ens") == [3.0, 6.0]


def test_a_bucket_that_cannot_be_read_stops_startup_naming_the_location(store):
    location = store.location("no-such-bucket", "models")
    assert f"model repository '{location}' cannot be read: {MISSING[store.scheme]}" in failed_start(location)


def test_repo_check_reads_the_repository_as_serve_would(store):
    put_model(store, "check", "c", factor=1)
    done = subprocess.run([sys.executable, "-m", "tritium.cli", "repo", "check", store.location("models", "check"),
                           "--json"], capture_output=True, timeout=60, cwd=Path(__file__).parents[2])
    report = json.loads(done.stdout)
    assert (done.returncode, report["ok"], [row["name"] for row in report["models"]]) == (0, True, ["c"])
