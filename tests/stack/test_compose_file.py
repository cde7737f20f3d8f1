"""docker-compose.yml checked against what the services actually accept (no Docker engine runs
here): every command parses with its service's own argument parser, every health check asks the
port the service listens on, dependencies wait for health, ports and GPUs are where they must
be, and every environment variable set is one the service reads."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from allocator_service.server.config import build_parser as allocator_parser
from executor_service.config import build_parser as executor_parser
from gateway.config import build_parser as gateway_parser
from pagedserve.cli.health import build_parser as health_parser
from tests.support.compose_file import COMPOSE_FILE, active_services, flag_value, load_compose

REPO = COMPOSE_FILE.parent
PARSERS = {"allocator_service": allocator_parser, "executor_service": executor_parser,
           "gateway": gateway_parser}
OURS = ["allocator", "executor", "executor-cpu", "gateway"]
# Read outside the argument parsers: the shared token, the gateway's key list, the model cache.
EXTRA_VARIABLES = {"PAGEDSERVE_AUTH_TOKEN", "PAGEDSERVE_GATEWAY_API_KEYS",
                   "PAGEDSERVE_CACHE_DIR"}


@pytest.fixture(scope="module")
def services():
    return load_compose()["services"]


def module_and_args(command: list[str]) -> tuple[str, list[str]]:
    assert command[:2] == ["python", "-m"], f"{command}: run as python -m MODULE"
    return command[2], command[3:]


@pytest.mark.parametrize("name", OURS)
def test_every_flag_of_every_command_is_one_the_service_knows(services, name):
    module, args = module_and_args(services[name]["command"])
    # parse_args exits (SystemExit) on a flag or value the parser refuses.
    parsed = PARSERS[module]().parse_args(args)
    assert parsed.host == "0.0.0.0", "listens on every interface of its container"


@pytest.mark.parametrize("name", OURS)
def test_the_health_check_asks_the_port_the_service_listens_on(services, name):
    service = services[name]
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "pagedserve", "health"]
    health = health_parser().parse_args(test[3:])
    _, args = module_and_args(service["command"])
    assert health.target == f"127.0.0.1:{flag_value(args, '--port')}"


def test_redis_is_persistent_and_healthy(services):
    redis = services["redis"]
    command = redis["command"]
    assert flag_value(command, "--appendonly") == "yes"
    assert flag_value(command, "--appendfsync") == "everysec"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_services_wait_for_what_they_depend_on_to_be_healthy(services):
    expected = {"allocator": {"redis"}, "executor": {"allocator"},
                "executor-cpu": {"allocator"},
                "gateway": {"allocator", "executor", "executor-cpu"}}
    for name, needs in expected.items():
        depends = services[name]["depends_on"]
        assert set(depends) == needs, name
        assert all(d["condition"] == "service_healthy" for d in depends.values())
    # Only one executor profile runs at a time: the gateway must not need the other.
    assert services["gateway"]["depends_on"]["executor"]["required"] is False
    assert services["gateway"]["depends_on"]["executor-cpu"]["required"] is False


def test_addresses_between_services_match_their_ports(services):
    _, allocator = module_and_args(services["allocator"]["command"])
    allocator_address = f"allocator:{flag_value(allocator, '--port')}"
    for name in ("executor", "executor-cpu", "gateway"):
        _, args = module_and_args(services[name]["command"])
        assert flag_value(args, "--allocator") == allocator_address, name
    state_url = flag_value(allocator, "--state-url")
    assert state_url.startswith("redis://redis:6379/")


def test_the_gateway_publishes_its_grpc_and_http_ports(services):
    _, args = module_and_args(services["gateway"]["command"])
    published = {port.rsplit(":", 1)[1] for port in services["gateway"]["ports"]}
    assert published == {flag_value(args, "--port"), flag_value(args, "--http-port")}
    for name in ("allocator", "executor", "executor-cpu", "redis"):
        assert "ports" not in services[name], f"{name} stays inside the compose network"


def test_the_gpu_executor_reserves_a_gpu_and_mounts_the_model_read_only(services):
    executor = services["executor"]
    (device,) = executor["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert device["count"] == 1, "one GPU per replica: --scale executor=N adds GPUs"
    assert "container_name" not in executor, "a fixed name would forbid --scale"
    _, args = module_and_args(executor["command"])
    (volume,) = executor["volumes"]
    assert volume.endswith(f":{flag_value(args, '--model')}:ro")
    assert flag_value(args, "--device") == "cuda"
    assert executor["build"]["dockerfile"] == "docker/Dockerfile.cuda"


def test_the_cpu_profile_runs_the_same_stack_without_gpus():
    compose = load_compose()
    gpu, cpu = active_services(compose, "gpu"), active_services(compose, "cpu")
    assert set(gpu) == {"redis", "allocator", "executor", "gateway"}
    assert set(cpu) == {"redis", "allocator", "executor-cpu", "gateway"}
    executor = cpu["executor-cpu"]
    assert "deploy" not in executor and "volumes" not in executor
    _, args = module_and_args(executor["command"])
    assert flag_value(args, "--model") is None, "the embedded default"
    assert flag_value(args, "--device") == "cpu"
    assert "COMPOSE_PROFILES=gpu" in (REPO / ".env").read_text().splitlines()


@pytest.mark.parametrize("name", OURS)
def test_every_environment_variable_set_is_one_the_service_reads(services, name):
    module, _ = module_and_args(services[name]["command"])
    help_text = " ".join(action.help or "" for action in PARSERS[module]()._actions)
    known = set(re.findall(r"\(env (PAGEDSERVE_\w+)", help_text)) | EXTRA_VARIABLES
    assert set(services[name]["environment"]) <= known


def test_every_image_is_built_by_a_dockerfile_that_exists():
    compose = load_compose()
    for name, service in compose["services"].items():
        if "build" in service:
            dockerfile = REPO / service["build"]["context"] / service["build"]["dockerfile"]
            assert dockerfile.is_file(), name
            text = dockerfile.read_text()
            for package in ("pagedserve", "allocator_service", "executor_service", "gateway",
                            "kernels"):
                assert f"COPY {package} " in text, f"{dockerfile.name} misses {package}"
    assert "nvidia/cuda" in (REPO / "docker" / "Dockerfile.cuda").read_text()
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "tests"} <= set(ignored)


def test_environment_variables_override_the_defaults():
    compose = load_compose({"PAGEDSERVE_MODEL_DIR": "/srv/llama", "PAGEDSERVE_HTTP_PORT": "9000"})
    services = compose["services"]
    assert services["executor"]["volumes"] == ["/srv/llama:/model:ro"]
    assert "9000:8000" in services["gateway"]["ports"]
    assert Path(COMPOSE_FILE).read_text().count("${PAGEDSERVE_AUTH_TOKEN:-}") == 4
