"""Fixtures that start the real allocator as a subprocess (see allocator_process.py)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from allocator_process import AllocatorProcess


@pytest.fixture
def allocator() -> Iterator[AllocatorProcess]:
    """A plain allocator of its own for one test."""
    with AllocatorProcess() as process:
        yield process


@pytest.fixture
def start_allocator() -> Iterator[Callable[..., AllocatorProcess]]:
    """Starts allocators with extra flags, e.g. start_allocator("--auth-token", "t",
    "--lease-ttl", "0.5"); every one started is stopped when the test ends."""
    started: list[AllocatorProcess] = []

    def start(*extra_args: str) -> AllocatorProcess:
        started.append(AllocatorProcess(*extra_args))
        return started[-1]

    yield start
    for process in started:
        process.stop()
