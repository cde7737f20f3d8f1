"""The API reference is current and covers every gRPC method and every HTTP route."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gateway.openai_http.api import OpenAIHttpApi
# The module, not its names: pytest would collect its tests again.
from tests.docs import test_generated_code

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted((ROOT / "protos").rglob("*.proto"))
GRPC_REFERENCE = ROOT / "docs" / "api-grpc.md"
HTTP_REFERENCE = ROOT / "docs" / "api-http.md"
SERVICE = re.compile(r"^service\s+(\w+)\s*\{(.*?)^\}", re.MULTILINE | re.DOTALL)
RPC = re.compile(r"^\s*rpc\s+(\w+)\s*\(", re.MULTILINE)
PATH_PARAM = re.compile(r"\\\{[^}]*\\\}")   # `{model_id:path}` once re.escape'd


def rpcs_in_protos() -> list[str]:
    """"Service.Method" for every rpc, read from the .proto text (not from the generator)."""
    return [f"{service}.{rpc}" for path in PROTOS
            for service, body in SERVICE.findall(path.read_text())
            for rpc in RPC.findall(body)]


def test_grpc_reference_matches_the_protos() -> None:
    check = subprocess.run([test_generated_code.protoc_python(), "-m", "scripts.gen_api_reference",
                            "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, (
        "docs/api-grpc.md is stale; run `make docs`\n" + check.stdout + check.stderr)


def test_grpc_reference_documents_every_rpc() -> None:
    rpcs = rpcs_in_protos()
    assert len(rpcs) == 18, rpcs   # Allocator 4, AllocatorAdmin 8, Executor 3, Gateway 3
    text = GRPC_REFERENCE.read_text()
    missing = [rpc for rpc in rpcs if f"#### {rpc}\n" not in text]
    assert not missing, f"rpcs missing from docs/api-grpc.md (run `make docs`): {missing}"


def test_http_reference_documents_every_route() -> None:
    # The constructor only builds the Starlette app; the handlers would need these two.
    routes = OpenAIHttpApi(generator=None, metrics=None).app.routes
    text = HTTP_REFERENCE.read_text()
    missing = []
    for route in routes:
        # "/v1/models/{model_id:path}" matches the reference's "/v1/models/{id}".
        path = PATH_PARAM.sub(r"\\{[^}]+\\}", re.escape(route.path))
        for method in sorted(route.methods - {"HEAD"}):   # Starlette adds HEAD to every GET
            if not re.search(rf"\b{method} {path}(?![\w/{{])", text):
                missing.append(f"{method} {route.path}")
    assert len(routes) == 12
    assert not missing, f"HTTP routes missing from docs/api-http.md: {missing}"
