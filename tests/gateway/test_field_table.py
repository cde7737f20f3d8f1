"""Every row of the request-field table (gateway/openai_http/fields.py, rendered into
docs/api-http.md) sent to a real gateway: supported and ignored fields are served, refused ones
get a 400 naming the field unless set to a value that asks for nothing."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from gateway.openai_http.fields import CHAT, COMPLETIONS, FIELDS, Field, Handling
from tests.support.allocator_wire import used_blocks
from tests.support.polling import wait_for

MODEL = "pagedserve-embedded-llama"
BASE = {
    COMPLETIONS: {"model": MODEL, "prompt": "Hi", "max_tokens": 2},
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
}
PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
ROWS = [(endpoint, entry) for entry in FIELDS for endpoint in entry.endpoints
        if entry.example is not None]


@pytest.fixture(scope="module")
def http(stack):
    _, gateway = stack
    with httpx.Client(base_url=gateway.http_url, timeout=60) as client:
        yield client


def send(http: httpx.Client, endpoint: str, fields: dict) -> httpx.Response:
    return http.post(PATHS[endpoint], json={**BASE[endpoint], **fields})


@pytest.mark.parametrize("endpoint, entry", ROWS,
                         ids=[f"{endpoint}-{entry.name}" for endpoint, entry in ROWS])
def test_every_field_is_served_refused_or_ignored_as_the_table_says(http, endpoint,
                                                                     entry: Field):
    response = send(http, endpoint, entry.example)
    if entry.handling is Handling.REFUSED:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["message"], error["param"]) == (entry.refusal(), entry.name)
        for neutral in entry.neutral:
            accepted = send(http, endpoint, {entry.name: neutral})
            assert accepted.status_code == 200, (neutral, accepted.text)
    else:
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_a_key_no_api_defines_is_refused_and_nothing_is_held(stack, http, endpoint):
    allocator, _ = stack
    response = send(http, endpoint, {"max_token": 4})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == ("Unrecognized request argument supplied: "
                                                   "max_token")
    # The example: min_tokens used to be dropped, and stop_token_ids ended it early.
    response = send(http, COMPLETIONS, {"prompt": "Hello", "max_tokens": 10, "temperature": 0,
                                        "stop_token_ids": [117], "min_tokens": 8})
    assert response.status_code == 400 and response.json()["error"]["param"] == "min_tokens"
    wait_for(lambda: used_blocks(allocator) == 0)


def test_the_docs_table_is_current():
    check = subprocess.run([sys.executable, "-m", "scripts.gen_field_table", "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
