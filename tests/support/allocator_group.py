"""Allocator groups for the tests: real allocator processes on free loopback ports, seen through
the same AllocatorGroup client the gateway and pagedctl use."""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.allocator_group import AllocatorGroup, merge_stats
from pagedserve.common.allocator_shards import shard_of
from pagedserve.supervisor.service_process import AllocatorProcess


class Shards:
    """An allocator group of running allocators, in shard order; `with` stops them."""

    def __init__(self, processes: Sequence[AllocatorProcess], token: str = "") -> None:
        self.processes = list(processes)
        self.addresses = [process.target for process in self.processes]
        self.tls_ca = ""
        self.client = AllocatorGroup(self.addresses, token)

    @classmethod
    def start(cls, count: int, *common_args: str,
              shard_args: Sequence[Sequence[str]] = ()) -> Shards:
        """`count` allocators started together; `shard_args[k]` are shard k's own flags (e.g.
        its Redis namespace)."""
        processes: list[AllocatorProcess] = []
        try:
            for index in range(count):
                own = shard_args[index] if index < len(shard_args) else ()
                processes.append(AllocatorProcess(*common_args, *own))
        except BaseException:
            for process in processes:
                process.stop()
            raise
        return cls(processes)

    @property
    def target(self) -> str:
        """What --allocator and pagedctl --target take for this group."""
        return ",".join(self.addresses)

    def executor_ids(self, prefix: str) -> list[str]:
        """One executor id per shard, in shard order, each one that shard owns: the first
        `prefix-N` that hashes there (the ports, and so the owners, change every run)."""
        ids: list[str] = []
        for address in self.addresses:
            ids.append(next(candidate for candidate in (f"{prefix}-{n}" for n in itertools.count())
                            if shard_of(candidate, self.addresses) == address))
        return ids

    def stats(self) -> pb.GetStatsResponse:
        answers = self.client.ask("GetStats", pb.GetStatsRequest(), 10.0)
        self.client.raise_failure(answers.failures)
        return merge_stats(list(answers.replies.values()))

    def used_blocks(self) -> int:
        return self.stats().total.num_used_blocks

    def epochs(self, index: int) -> dict[str, int]:
        """The executors shard `index` lists, in id order, with their epochs."""
        answers = self.client.ask("ListExecutors", pb.ListExecutorsRequest(), 10.0,
                                  shards=[self.addresses[index]])
        self.client.raise_failure(answers.failures)
        (reply,) = answers.replies.values()
        return {executor.executor_id: executor.epoch for executor in reply.executors}

    def sequences(self) -> dict[str, set[str]]:
        """Each executor's live sequence ids, over every shard."""
        answers = self.client.ask("ListSequences", pb.ListSequencesRequest(), 10.0)
        self.client.raise_failure(answers.failures)
        found: dict[str, set[str]] = {}
        for reply in answers.replies.values():
            for seq in reply.sequences:
                found.setdefault(seq.executor_id, set()).add(seq.seq_id)
        return found

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.client.close()

    def __enter__(self) -> Shards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
