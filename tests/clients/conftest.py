"""The client tests' live stack: one per module, so each client meets a fresh gateway and a
failure in one client's module cannot leave state behind for the next."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.clients.live_stack import LiveStack, live_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LiveStack]:
    with live_stack(tmp_path_factory.mktemp("cache")) as stack:
        yield stack
