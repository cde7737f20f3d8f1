"""Bounded admission: running and queued limits, refusal beyond them, first come first served."""
from __future__ import annotations

import threading

import pytest
from executor_stream import wait_for

from gateway.admission import Admission
from pagedserve.common.errors import ResourceExhausted, Unavailable


def hold(admission: Admission, release: threading.Event, order: list[int], index: int,
         cancelled=lambda: False) -> threading.Thread:
    def run() -> None:
        try:
            with admission.slot(cancelled):
                order.append(index)
                release.wait(5)
        except (ResourceExhausted, Unavailable) as error:
            order.append(type(error).__name__)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_beyond_running_and_queued_limits_a_request_is_refused_at_once():
    admission, release, order = Admission(max_running=1, max_queued=2), threading.Event(), []
    threads = [hold(admission, release, order, 0)]
    wait_for(lambda: admission.running == 1)
    threads += [hold(admission, release, order, i) for i in (1, 2)]
    wait_for(lambda: admission.queued == 2)
    with pytest.raises(ResourceExhausted, match="1 requests running and 2 queued"):
        with admission.slot():
            pass
    release.set()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2]            # queued ones ran in arrival order
    assert (admission.running, admission.queued) == (0, 0)


def test_a_cancelled_waiter_leaves_the_queue():
    admission, release, order = Admission(max_running=1, max_queued=4), threading.Event(), []
    cancel = threading.Event()
    first = hold(admission, release, order, 0)
    wait_for(lambda: admission.running == 1)
    waiter = hold(admission, release, order, 1, cancelled=cancel.is_set)
    wait_for(lambda: admission.queued == 1)
    cancel.set()
    waiter.join(5)
    assert order == [0, "Unavailable"] and admission.queued == 0
    release.set()
    first.join(5)
    assert admission.running == 0
