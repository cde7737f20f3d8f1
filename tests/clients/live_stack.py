"""The live stack each client module runs against, and the plain answers its client's results are
checked against: the official `openai` package and raw HTTP on the same gateway.

The model is the embedded one: tiny, random, its text gibberish. So the client tests assert on
protocol and consistency (the client got what the API gives for the same request), never on
quality.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from executor_service.model.embedded import embedded_model_dir
from pagedserve.supervisor.service_process import AllocatorProcess, GatewayProcess, gateway_stack

MODEL = "pagedserve-embedded-llama"
# Keys on, as a deployment runs: each client must send it the way its users configure it.
API_KEY = "sk-clients-key"


@dataclass(frozen=True, slots=True)
class LiveStack:
    allocator: AllocatorProcess
    gateway: GatewayProcess
    # The checkpoint the executor serves: its tokenizer files stand in for a hub download.
    model_dir: Path

    @property
    def base_url(self) -> str:
        """The OpenAI base URL clients are given: http://127.0.0.1:PORT/v1."""
        return f"{self.gateway.http_url}/v1"

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=API_KEY, max_retries=0, timeout=60)

    def post(self, path: str, body: dict) -> dict:
        """POST a JSON body to the gateway's HTTP API (`path` from the root, e.g. /tokenize)."""
        response = httpx.post(f"{self.gateway.http_url}{path}", json=body, timeout=60,
                              headers={"Authorization": f"Bearer {API_KEY}"})
        assert response.status_code == 200, response.text
        return response.json()

    def tokenizer_info(self) -> dict:
        """GET /tokenizer_info: the special tokens and chat template, as clients read them."""
        response = httpx.get(f"{self.gateway.http_url}/tokenizer_info", timeout=60,
                             headers={"Authorization": f"Bearer {API_KEY}"})
        assert response.status_code == 200, response.text
        return response.json()

    def token_ids(self, text: str) -> list[int]:
        """`text` as the served model's token ids, no special tokens added."""
        return self.post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]

    def prompt_logprobs(self, prompt: list[int]) -> list[float | None]:
        """Each prompt token's log-probability given the tokens before it (None for the first):
        /v1/completions scoring the prompt alone (echo, logprobs, max_tokens 0)."""
        scored = self.post("/v1/completions", {"model": MODEL, "prompt": prompt, "echo": True,
                                               "logprobs": 0, "max_tokens": 0})
        (choice,) = scored["choices"]
        return choice["logprobs"]["token_logprobs"]


class RequestLog:
    """An httpx client for a client library (`http_client=`) that keeps the JSON body of every
    request it sends: what the library put on the wire, to replay with the openai package."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.http_client = httpx.Client(timeout=60, event_hooks={"request": [self._keep]})

    def _keep(self, request: httpx.Request) -> None:
        if request.method == "POST":
            self.bodies.append(json.loads(request.content))


@contextmanager
def live_stack(cache: Path) -> Iterator[LiveStack]:
    """An allocator, one executor with the embedded model (cached under `cache`) and a gateway
    that asks for `API_KEY`; stopped on exit."""
    with gateway_stack(cache, gateway_args=("--api-key", API_KEY)) as (allocator, gateway):
        yield LiveStack(allocator, gateway, embedded_model_dir(cache))
