"""Which executors exist and what they serve, learned from the allocator and kept current.

Every `refresh_s` the directory asks the allocator for its executors (ListExecutors; in an
allocator group, every shard, each for the executors it owns). A new one
is asked for its model (GetInfo) and,
the first time its tokenizer's digest is seen, for its tokenizer files (GetTokenizer); then a
Session link is opened to it. An executor whose link broke, or that the allocator lists at
another address (restarted), is dropped at once. One the allocator no longer lists while its
link lives (its lease lapsed: most often it was slow to renew, not dead) gets no new requests,
but its link is kept for the requests it runs, for up to UNLISTED_GRACE_S: such an executor
re-registers at its next call to the allocator, recomputes them on its new pool, and is routed
to again. A shard that does not answer says nothing about its executors: they keep their
entries as they were (their streams pause until it is back, the others' go on). Executors are
grouped into models by name; one whose tokenizer differs from the others of its name is left
out, because the gateway tokenizes once per model.

Readers get immutable snapshots, so routing never sees a half-updated directory.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import grpc

from gateway.executors.link import ExecutorLink
from gateway.tokenizer import GatewayTokenizer
from pagedserve.common.allocator_group import AllocatorGroup, ListedExecutor
from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.executor.v1 import executor_pb2_grpc as epb_grpc

log = logging.getLogger(__name__)
RPC_TIMEOUT_S = 5.0
# How long the live link of an executor the allocator stopped listing is kept for its requests.
UNLISTED_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class ExecutorEntry:
    info: epb.ExecutorInfo      # what GetInfo said when the link opened
    link: ExecutorLink
    # For calls made off the event loop (GetInfo at each metrics scrape); the link has its own.
    channel: grpc.Channel
    # The allocator (shard) that lists it.
    shard: str

    def close(self, reason: str = "the gateway closed the link") -> None:
        self.link.close(reason)
        self.channel.close()

    @property
    def executor_id(self) -> str:
        return self.info.executor_id


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    tokenizer: GatewayTokenizer
    tokenizer_digest: str
    # When this gateway first saw it served (Unix seconds): the model card's `created`.
    created: int = 0
    # Live executors serving it, by executor id.
    executors: dict[str, ExecutorEntry] = field(default_factory=dict)


class ExecutorDirectory:
    def __init__(self, allocators: AllocatorGroup,
                 open_channel: Callable[[str], grpc.Channel],
                 open_link_channel: Callable[[str], grpc.aio.Channel],
                 loop: asyncio.AbstractEventLoop, refresh_s: float = 1.0) -> None:
        """`open_channel` makes the channels this thread asks executors on (GetInfo,
        GetTokenizer); `open_link_channel` the grpc.aio channels of the links, which run on
        `loop`, the event loop the gateway's requests run on."""
        self._allocators = allocators
        self._open_channel = open_channel
        # Model name -> when it was first served here (Unix seconds).
        self._first_seen: dict[str, int] = {}
        self._open_link_channel = open_link_channel
        self._loop = loop
        self._refresh_s = refresh_s
        self._entries: dict[str, ExecutorEntry] = {}
        # Executor id -> when the allocator stopped listing it, for live links kept meanwhile.
        self._unlisted: dict[str, float] = {}
        self._tokenizers: dict[str, GatewayTokenizer] = {}
        self.models: dict[str, ServedModel] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="executor-directory",
                                        daemon=True)
        # Called with the fresh models after each refresh (health, metrics).
        self.on_change: Callable[[dict[str, ServedModel]], None] = lambda models: None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for entry in self._entries.values():
            entry.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except grpc.RpcError as error:
                log.warning("cannot list executors at the allocator: %s %s",
                            error.code().name, error.details())
            self._stop.wait(self._refresh_s)

    def refresh(self) -> None:
        listed, failed = self._allocators.list_executors(RPC_TIMEOUT_S)
        if len(failed) == len(self._allocators.shards):
            raise next(iter(failed.values()))    # nobody answered: _run logs it, nothing changes
        for shard, error in failed.items():
            log.warning("cannot list the executors of allocator %s: %s %s; keeping them as "
                        "they were", shard, error.code().name, error.details())
        now = time.monotonic()
        for executor_id, entry in list(self._entries.items()):
            current = listed.get(executor_id)
            if current is None and entry.shard in failed and entry.link.alive:
                continue     # its shard did not answer: nothing new is known about it
            if current is None and entry.link.alive:
                # Dropping the link would end the requests it runs, which the executor
                # finishes once it has re-registered (see the module docstring).
                if executor_id not in self._unlisted:
                    log.warning("executor %s is no longer registered with the allocator; "
                                "routing nothing new to it, its open requests go on",
                                executor_id)
                since = self._unlisted.setdefault(executor_id, now)
                if now - since < UNLISTED_GRACE_S:
                    continue
            self._unlisted.pop(executor_id, None)
            # A new epoch alone is no reason: an executor re-registers after an allocator
            # restart and its stream lives on. A restarted executor breaks its stream.
            if current is None or not entry.link.alive or \
                    current.info.address != entry.link.address:
                reason = entry.link.lost or (
                    f"executor {executor_id} has not been registered with the allocator for "
                    f"{UNLISTED_GRACE_S:.0f} s (its lease lapsed)" if current is None else
                    f"executor {executor_id} moved to {current.info.address}")
                log.info("dropping executor %s (%s)", executor_id, reason)
                entry.close(reason)
                del self._entries[executor_id]
        for executor_id, listing in listed.items():
            entry = self._entries.get(executor_id)
            if entry is not None and entry.shard != listing.shard:
                # It registered with another shard (the shard list changed): follow it.
                self._entries[executor_id] = replace(entry, shard=listing.shard)
            if executor_id not in self._entries:
                entry = self._connect(listing)
                if entry is not None:
                    self._entries[executor_id] = entry
        self.models = self._group()
        self.on_change(self.models)

    def _connect(self, listed: ListedExecutor) -> ExecutorEntry | None:
        listing = listed.info
        channel = self._open_channel(listing.address)
        stub = epb_grpc.ExecutorStub(channel)
        try:
            info = stub.GetInfo(epb.GetInfoRequest(), timeout=RPC_TIMEOUT_S)
            if info.tokenizer_digest not in self._tokenizers:
                files: dict[str, bytes] = {}
                for chunk in stub.GetTokenizer(epb.GetTokenizerRequest(),
                                               timeout=RPC_TIMEOUT_S * 6):
                    files[chunk.file_name] = files.get(chunk.file_name, b"") + chunk.data
                self._tokenizers[info.tokenizer_digest] = GatewayTokenizer.from_files(files)
        except grpc.RpcError as error:   # still loading (UNAVAILABLE), or unreachable
            log.info("executor %s at %s not ready: %s", listing.executor_id, listing.address,
                     error.code().name)
            channel.close()
            return None
        try:
            link = ExecutorLink(info.executor_id, listing.address, self._open_link_channel,
                                self._loop)
        except (RuntimeError, TimeoutError) as error:   # the loop is busy, or shutting down
            log.warning("executor %s: no link opened (%r); trying again at the next refresh",
                        listing.executor_id, error)
            channel.close()
            return None
        log.info("executor %s at %s serves %s", info.executor_id, listing.address,
                 info.model_name)
        return ExecutorEntry(info, link, channel, listed.shard)

    def _group(self) -> dict[str, ServedModel]:
        models: dict[str, ServedModel] = {}
        for entry in sorted(self._entries.values(), key=lambda e: e.executor_id):
            if entry.executor_id in self._unlisted:
                continue
            info = entry.info
            model = models.get(info.model_name)
            if model is None:
                created = self._first_seen.setdefault(info.model_name, int(time.time()))
                model = models[info.model_name] = ServedModel(
                    info.model_name, info.max_model_len, info.vocab_size,
                    tuple(info.eos_token_ids), self._tokenizers[info.tokenizer_digest],
                    info.tokenizer_digest, created)
            elif info.tokenizer_digest != model.tokenizer_digest:
                log.warning("executor %s serves %s with another tokenizer than %s; not routed "
                            "to", info.executor_id, info.model_name,
                            ", ".join(model.executors))
                continue
            model.executors[info.executor_id] = entry
        return models
