"""The gateway tests' default stack: an allocator, an executor and a gateway on the embedded
model, one per test module, and an OpenAI client of its HTTP API. A module that needs other
flags or another client defines its own `stack` or `client`, which takes precedence."""
from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from pagedserve.supervisor.service_process import AllocatorProcess, GatewayProcess, gateway_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[AllocatorProcess, GatewayProcess]]:
    with gateway_stack(tmp_path_factory.mktemp("cache")) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack) -> Iterator[openai.OpenAI]:
    _, gateway = stack
    with openai.OpenAI(base_url=f"{gateway.http_url}/v1", api_key="none", max_retries=0,
                       timeout=60) as client:
        yield client
