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
OURS = ["allocator", "executor-gpu0", "executor-cpu", "gateway"]
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
    expected = {"allocator": {"redis"}, "executor-gpu0": {"allocator"},
                "executor-cpu": {"allocator"},
                "gateway": {"allocator", "executor-gpu0", "executor-cpu"}}
    for name, needs in expected.items():
        depends = services[name]["depends_on"]
        assert set(depends) == needs, name
        assert all(d["condition"] == "service_healthy" for d in depends.values())
    # Only one executor profile runs at a time: the gateway must not need the other.
    assert services["gateway"]["depends_on"]["executor-gpu0"]["required"] is False
    assert services["gateway"]["depends_on"]["executor-cpu"]["required"] is False


ALLOCATOR_VARIABLES = {"executor-gpu0": "PAGEDSERVE_EXECUTOR_ALLOCATOR",
                       "executor-cpu": "PAGEDSERVE_EXECUTOR_ALLOCATOR",
                       "gateway": "PAGEDSERVE_GATEWAY_ALLOCATOR"}


def test_addresses_between_services_match_their_ports(services):
    _, allocator = module_and_args(services["allocator"]["command"])
    allocator_address = f"allocator:{flag_value(allocator, '--port')}"
    for name, variable in ALLOCATOR_VARIABLES.items():
        # In the environment only, where docker-compose.shards.yml replaces it with the group.
        _, args = module_and_args(services[name]["command"])
        assert flag_value(args, "--allocator") is None, name
        assert services[name]["environment"][variable] == allocator_address, name
    state_url = flag_value(allocator, "--state-url")
    assert state_url.startswith("redis://redis:6379/")


@pytest.fixture(scope="module")
def sharded():
    return load_compose(shards=True)["services"]


def shard_names(services) -> list[str]:
    return [name for name, service in services.items()
            if service.get("command", [None] * 3)[2] == "allocator_service"]


def test_the_shards_file_adds_allocators_each_with_its_own_namespace(sharded):
    names = shard_names(sharded)
    assert names == ["allocator", "allocator-1", "allocator-2", "allocator-3"]
    namespaces, state_urls = [], set()
    for name in names:
        module, args = module_and_args(sharded[name]["command"])
        parsed = PARSERS[module]().parse_args(args)
        assert parsed.host == "0.0.0.0", name
        health = health_parser().parse_args(sharded[name]["healthcheck"]["test"][3:])
        assert health.target == f"127.0.0.1:{parsed.port}", name
        assert sharded[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert sharded[name]["image"] == "pagedserve:latest", "the image the base file builds"
        assert sharded[name]["restart"] == "unless-stopped"
        namespaces.append(parsed.state_namespace)
        state_urls.add(parsed.state_url)
    assert len(set(namespaces)) == len(names), f"shards share a namespace: {namespaces}"
    assert namespaces[0] == "pagedserve:allocator", "shard 0 keeps a single allocator's state"
    assert state_urls == {"redis://redis:6379/0"}


def test_every_executor_and_the_gateway_list_every_shard_and_wait_for_it(sharded):
    shards = []
    for name in shard_names(sharded):
        _, args = module_and_args(sharded[name]["command"])
        shards.append(f"{name}:{flag_value(args, '--port')}")
    for name, variable in ALLOCATOR_VARIABLES.items():
        assert sharded[name]["environment"][variable] == ",".join(shards), name
        depends = sharded[name]["depends_on"]
        assert {shard.split(":")[0] for shard in shards} <= set(depends), name
        assert all(depends[shard.split(":")[0]]["condition"] == "service_healthy"
                   for shard in shards)
        assert "PAGEDSERVE_AUTH_TOKEN" in sharded[name]["environment"], "base entries kept"
    assert sharded["executor-cpu"]["profiles"] == ["cpu"], "the base file's profile kept"


def test_the_gateway_publishes_its_grpc_and_http_ports(services):
    _, args = module_and_args(services["gateway"]["command"])
    published = {port.rsplit(":", 1)[1] for port in services["gateway"]["ports"]}
    assert published == {flag_value(args, "--port"), flag_value(args, "--http-port")}
    for name in ("allocator", "executor-gpu0", "executor-cpu", "redis"):
        assert "ports" not in services[name], f"{name} stays inside the compose network"


def gpu_executors(services) -> dict[str, dict]:
    return {name: service for name, service in services.items()
            if "gpu" in service.get("profiles", ())}


def test_each_gpu_executor_owns_one_distinct_gpu_and_mounts_the_model_read_only(services):
    executors = gpu_executors(services)
    assert "executor-gpu0" in executors
    devices = []
    for name, executor in executors.items():
        (device,) = executor["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        # `count: 1` per replica of one scaled service let every replica land on GPU 0, each
        # sizing its cache to 90 % of the same memory: a pinned device per service instead.
        assert "count" not in device, name
        (device_id,) = device["device_ids"]
        assert name == f"executor-gpu{device_id}", "named after its GPU"
        devices.append(device_id)
        _, args = module_and_args(executor["command"])
        model = next(v for v in executor["volumes"] if v.endswith(":ro"))
        assert model.endswith(f":{flag_value(args, '--model')}:ro")
        assert flag_value(args, "--device") == "cuda"
        assert executor["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert len(set(devices)) == len(devices)
    # How to add GPU N is written where an operator looks.
    assert 'device_ids: ["N"]' in COMPOSE_FILE.read_text()


def test_compiled_kernels_live_in_a_volume_where_the_image_points_its_caches(services):
    text = (REPO / "docker" / "Dockerfile.cuda").read_text()
    caches = dict(re.findall(r"(TRITON_CACHE_DIR|TORCHINDUCTOR_CACHE_DIR)=(\S+)", text))
    assert set(caches) == {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"}
    volumes = load_compose()["volumes"]
    for name, executor in gpu_executors(services).items():
        mounts = dict(v.split(":", 1)[::-1] for v in executor["volumes"] if not v.endswith(":ro"))
        (mount_point,) = mounts
        assert mounts[mount_point] in volumes, "a named volume: it outlives the container"
        for path in caches.values():
            assert path.startswith(mount_point + "/"), f"{name}: {path} is not in the volume"


def test_the_cuda_image_can_build_triton_launchers_and_matches_torch_cuda():
    text = (REPO / "docker" / "Dockerfile.cuda").read_text()
    apt = next(line for line in text.replace("\\\n", " ").splitlines()
               if "apt-get install" in line)
    for package in ("python3-dev", "build-essential"):
        assert package in apt.split(), f"{package}: Triton compiles its launcher at run time"
    # torch==2.13.0 from PyPI is a CUDA 13 build: with no index given, the base must be CUDA
    # 13 and the driver it needs stated; with a CUDA-specific index, its CUDA must match.
    base = re.search(r"ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.(\d+)", text)
    index = re.search(r"ARG TORCH_INDEX_URL=(\S*)", text)
    assert base and index
    if index.group(1):
        assert re.search(rf"/cu{base.group(1)}{base.group(2)}\d?$", index.group(1))
    else:
        assert base.group(1) == "13"
        assert "driver >= 580" in text
    assert "torch.version.cuda" in text, "the build fails on a CPU-only torch"


def test_the_cpu_profile_runs_the_same_stack_without_gpus():
    compose = load_compose()
    gpu, cpu = active_services(compose, "gpu"), active_services(compose, "cpu")
    assert set(gpu) == {"redis", "allocator", "executor-gpu0", "gateway"}
    assert set(cpu) == {"redis", "allocator", "executor-cpu", "gateway"}
    executor = cpu["executor-cpu"]
    assert "deploy" not in executor and "volumes" not in executor
    _, args = module_and_args(executor["command"])
    assert flag_value(args, "--model") is None, "the embedded default"
    assert flag_value(args, "--device") == "cpu"
    assert "COMPOSE_PROFILES=gpu" in (REPO / ".env").read_text().splitlines()


@pytest.mark.parametrize("shards", [False, True], ids=["base", "with-shards"])
def test_every_environment_variable_set_is_one_the_service_reads(shards):
    for name, service in load_compose(shards=shards)["services"].items():
        if name == "redis":
            continue
        module, _ = module_and_args(service["command"])
        help_text = " ".join(action.help or "" for action in PARSERS[module]()._actions)
        known = set(re.findall(r"\(env (PAGEDSERVE_\w+)", help_text)) | EXTRA_VARIABLES
        assert set(service["environment"]) <= known, name


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


def test_the_cpu_image_compiles_the_allocator_core_as_make_does():
    # The allocator runs from the CPU image; without the compiled core it serves about 1.4
    # times fewer executors per core.
    text = (REPO / "docker" / "Dockerfile").read_text()
    run = " ".join(text.replace("\\\n", " ").split())
    steps = ["pip install --extra-index-url https://download.pytorch.org/whl/cpu .",
             "python -m scripts.build_allocator_core",
             "PAGEDSERVE_ALLOCATOR_CORE=compiled python -c "
             '"import allocator_service.core.allocator"',
             "apt-get purge -y --auto-remove gcc libc6-dev"]
    at = [run.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), "install, compile, check it loads, drop the compiler"
    pinned = re.search(r'"(mypy==[\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert f"pip install {pinned} " in run, "mypy as pinned in pyproject.toml"
    # The build script reaches the image although scripts/ does not.
    assert "COPY scripts/__init__.py scripts/build_allocator_core.py ./scripts/" in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"scripts", "!scripts/__init__.py", "!scripts/build_allocator_core.py"} <= set(ignored)
    # Services import the sources beside the build: compose runs them as modules from WORKDIR.
    assert "WORKDIR /opt/pagedserve" in text
    compose = load_compose()
    assert compose["services"]["allocator"]["command"][:3] == ["python", "-m",
                                                               "allocator_service"]


def test_environment_variables_override_the_defaults():
    compose = load_compose({"PAGEDSERVE_MODEL_DIR": "/srv/llama", "PAGEDSERVE_HTTP_PORT": "9000"})
    services = compose["services"]
    assert services["executor-gpu0"]["volumes"][0] == "/srv/llama:/model:ro"
    assert "9000:8000" in services["gateway"]["ports"]
    assert Path(COMPOSE_FILE).read_text().count("${PAGEDSERVE_AUTH_TOKEN:-}") == 4
