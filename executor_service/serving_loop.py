"""The engine's one thread: it takes submissions and cancellations from the sessions, steps the
engine while there is work, hands each request's news to the session that submitted it, and
keeps the allocator lease alive.

Sessions never touch the engine: they put commands on a queue and read updates from their
own queue, so the engine needs no lock and a slow client cannot stall an iteration. A session
that ends cancels its requests. When the allocator has dropped our pool (it restarted without
durable state, or our lease lapsed), the loop re-registers and every running request is
recomputed on the new pool; a durable allocator that recovered our pool simply continues.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from executor_service.allocator_client import PoolLost
from executor_service.engine.engine import Engine
from executor_service.engine.request_output import RequestOutput
from executor_service.heap import FullCollections
from pagedserve.common.errors import PagedServeError
from pagedserve.protocol.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Session:
    """One client stream: the updates waiting for it (in batches: everything one iteration
    made for the stream is put at once, so it goes down in one message) and the requests it
    owns."""
    updates: queue.Queue[list] = field(default_factory=queue.Queue)
    request_ids: set[str] = field(default_factory=set)
    closed: bool = False


@dataclass(slots=True)
class Refusal:
    """A submission the engine refused, reported on the submitting session."""
    request_id: str
    error: PagedServeError


class ServingLoop:
    def __init__(self, engine: Engine, heartbeat_interval_s: float = 1.0) -> None:
        self.engine = engine
        self.heartbeat_interval_s = heartbeat_interval_s
        self.commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self.owners: dict[str, Session] = {}
        self.full_collections = FullCollections()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # -- called from session threads ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.commands.put(lambda: None)
        self._thread.join(timeout=10)

    def submit(self, session: Session, request_id: str, prompt: list[int],
               params: SamplingParams, cache_salt: str) -> None:
        self.commands.put(lambda: self._submit(session, request_id, prompt, params, cache_salt))

    def cancel(self, session: Session, request_id: str) -> None:
        self.commands.put(lambda: self._cancel(session, request_id))

    def close(self, session: Session) -> None:
        self.commands.put(lambda: self._close(session))

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        next_heartbeat = time.monotonic() + self.heartbeat_interval_s
        while not self._stop.is_set():
            try:
                self._drain_commands(block=not self.engine.has_work())
                if self.engine.has_work():
                    self._deliver(self.engine.step())
                self.full_collections.between_iterations()
                if time.monotonic() >= next_heartbeat:
                    next_heartbeat = time.monotonic() + self.heartbeat_interval_s
                    self.engine.allocator.heartbeat(len(self.engine.scheduler.waiting),
                                                    len(self.engine.scheduler.running))
            except PoolLost as lost:
                log.warning("the allocator lost our pool (%s); re-registering", lost)
                self.engine.restart_on_new_pool()
            except Exception:  # noqa: BLE001 - one bad iteration must not kill the executor
                log.exception("engine iteration failed; failing its requests")
                self._deliver(self.engine.fail_all("internal error in the executor"))

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self.commands.get(timeout=self.heartbeat_interval_s if block else 0)
        except queue.Empty:
            return
        command()
        while True:
            try:
                self.commands.get_nowait()()
            except queue.Empty:
                return

    def _submit(self, session: Session, request_id: str, prompt: list[int],
                params: SamplingParams, cache_salt: str) -> None:
        if session.closed:
            return
        try:
            self.engine.add_request(request_id, prompt, params, cache_salt)
        except PagedServeError as error:
            session.updates.put([Refusal(request_id, error)])
            return
        self.owners[request_id] = session
        session.request_ids.add(request_id)

    def _cancel(self, session: Session, request_id: str) -> None:
        if self.owners.get(request_id) is session:
            self.engine.abort(request_id)
            # Its last update goes out now, not with the next iteration's: the id is free
            # again, and a request submitted under it before then must not be taken for the
            # cancelled one's end.
            self._deliver(self.engine.drain_outputs())

    def _close(self, session: Session) -> None:
        session.closed = True
        for request_id in list(session.request_ids):
            if self.owners.get(request_id) is session:
                self.engine.abort(request_id)
        self._deliver(self.engine.drain_outputs())

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        batches: dict[Session, list[RequestOutput]] = {}
        for output in outputs:
            session = self.owners.get(output.request_id)
            if session is None:
                continue
            if output.finished:
                del self.owners[output.request_id]
                session.request_ids.discard(output.request_id)
            if not session.closed:
                batches.setdefault(session, []).append(output)
        # One put per session: its sender wakes once per iteration, not once per request.
        for session, batch in batches.items():
            session.updates.put(batch)
