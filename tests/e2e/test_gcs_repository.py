"""Model repositories in Google Cloud Storage, served as Triton serves them (``--model-repository
gs://bucket/path``): the servers read a real GCS server (an emulator of its JSON API, on
loopback, named as for Triton by ``CLOUD_STORAGE_EMULATOR_ENDPOINT``); polling follows the
bucket. What the stores share (the host's copy, loads, worker hosts) is tested with S3 in
tests/e2e/test_s3_repository.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_s3_repository import ENSEMBLE, failed_start, infer, polling_follows, put_model
from tests.gcs_server import gcs_server
from tests.servers import TritiumServer


@pytest.fixture(scope="module")
def gcs():
    with pytest.MonkeyPatch.context() as patch, gcs_server("models") as server:
        for name, value in server.environment.items():   # the servers started here read them as Triton does
            patch.setenv(name, value)
        yield server


def test_polling_follows_the_bucket_and_an_ensemble_s_folder_marker_is_its_version(gcs):
    put_model(gcs, "poll", "twice", factor=2)
    gcs.put("models", "poll/ens/config.pbtxt", ENSEMBLE)
    gcs.put("models", "poll/ens/1/", "")   # the empty version folder, as the console makes it
    with TritiumServer(gcs.location("models", "poll"), "--model-control-mode", "poll",
                       "--repository-poll-secs", "1") as server:
        assert infer(server.url, "ens") == [2.0, 4.0]
        polling_follows(gcs, server.url, "poll", "twice")
        assert infer(server.url, "ens") == [3.0, 6.0]


def test_a_bucket_that_cannot_be_read_stops_startup_naming_the_location(gcs):
    location = gcs.location("no-such-bucket", "models")
    output = failed_start(location)
    assert f"model repository '{location}' cannot be read: cannot list gs://no-such-bucket/models/: 404 " in output


def test_repo_check_reads_a_gcs_repository_as_serve_would(gcs):
    put_model(gcs, "check", "c", factor=1)
    done = subprocess.run([sys.executable, "-m", "tritium.cli", "repo", "check", gcs.location("models", "check"),
                           "--json"], capture_output=True, timeout=60, cwd=Path(__file__).parents[2])
    report = json.loads(done.stdout)
    assert (done.returncode, report["ok"], [row["name"] for row in report["models"]]) == (0, True, ["c"])
