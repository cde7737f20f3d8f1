"""The cluster's state as Prometheus metrics, read live at each scrape of the gateway's /metrics:
one place to scrape for a whole deployment.

From the allocator (AllocatorAdmin.GetStats), per executor pool:
    pagedserve_kv_usage_ratio                 used blocks / blocks
    pagedserve_kv_blocks{state}               used, free, cached_free (free but reusable prefix)
    pagedserve_prefix_cache_hit_rate          hit tokens / looked-up tokens, since the pool began
    pagedserve_prefix_cache_query_tokens_total, pagedserve_prefix_cache_hit_tokens_total
From each executor the gateway routes to (Executor.GetInfo):
    pagedserve_executor_preemptions_total     sequences preempted for lack of blocks
    pagedserve_executor_allocator_stalls_total iterations that waited on the allocator
    pagedserve_executor_requests{state}       running, waiting
And pagedserve_allocator_up, 0 when the allocator (any shard of an allocator group) did not
answer this scrape, with pagedserve_allocator_shard_up{shard} for each shard; the pools of the
shards that answered are reported all the same.

A scrape asks each service with a short timeout, so a dead service costs a scrape at most
that long and shows up as a missing series (or allocator_up 0), never as a hung /metrics.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.executors.directory import ExecutorDirectory
from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.common.allocator_group import AllocatorGroup, merge_stats
from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.executor.v1 import executor_pb2_grpc as epb_grpc

log = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 1.0


class ClusterCollector(Collector):
    def __init__(self, allocators: AllocatorGroup, directory: ExecutorDirectory) -> None:
        self._allocators = allocators
        self._directory = directory

    def collect(self) -> Iterator[Metric]:
        yield from self._allocator_metrics()
        yield from self._executor_metrics()

    def describe(self) -> list[Metric]:
        """Every family `collect` can yield, empty: the registry checks names with it, without
        asking the services, and so can a test (a scrape shows pools only while they answer)."""
        return declared_families()

    def _allocator_metrics(self) -> Iterator[Metric]:
        answers = self._allocators.ask("GetStats", apb.GetStatsRequest(), SCRAPE_TIMEOUT_S)
        for shard, error in answers.failures.items():
            log.warning("metrics: allocator %s GetStats failed: %s", shard, error.code().name)
        up, shard_up = _allocator_up_families()
        up.add_metric([], 0 if answers.failures else 1)
        for shard in self._allocators.shards:
            shard_up.add_metric([shard], 0 if shard in answers.failures else 1)
        yield from (up, shard_up)
        if not answers.replies:
            return
        stats = merge_stats(list(answers.replies.values()))
        usage, blocks, hit_rate, queried, hits = _pool_families()
        for pool in stats.pools:
            executor = [pool.executor_id]
            usage.add_metric(executor, pool.num_used_blocks / max(pool.num_blocks, 1))
            for state, count in (("used", pool.num_used_blocks), ("free", pool.num_free_blocks),
                                 ("cached_free", pool.num_cached_free_blocks)):
                blocks.add_metric([pool.executor_id, state], count)
            hit_rate.add_metric(executor, pool.prefix_hit_rate)
            queried.add_metric(executor, pool.prefix_query_tokens)
            hits.add_metric(executor, pool.prefix_hit_tokens)
        yield from (usage, blocks, hit_rate, queried, hits)

    def _executor_metrics(self) -> Iterator[Metric]:
        preemptions, stalls, requests = _executor_families()
        for model in self._directory.models.values():
            for executor_id, entry in model.executors.items():
                try:
                    info = epb_grpc.ExecutorStub(entry.channel).GetInfo(
                        epb.GetInfoRequest(), timeout=SCRAPE_TIMEOUT_S)
                except grpc.RpcError as error:
                    log.warning("metrics: executor %s GetInfo failed: %s", executor_id,
                                error.code().name)
                    continue
                preemptions.add_metric([executor_id], info.num_preemptions)
                stalls.add_metric([executor_id], info.num_stalls)
                requests.add_metric([executor_id, "running"], info.num_running)
                requests.add_metric([executor_id, "waiting"], info.num_waiting)
        yield from (preemptions, stalls, requests)


# The families, empty; `collect` fills fresh ones at each scrape, `describe` lists them.
def declared_families() -> list[Metric]:
    return [*_allocator_up_families(), *_pool_families(), *_executor_families()]


def _allocator_up_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    return (GaugeMetricFamily("pagedserve_allocator_up", "1 when the allocator (every shard of "
                              "a group) answered this scrape"),
            GaugeMetricFamily("pagedserve_allocator_shard_up",
                              "1 when this allocator of the group answered this scrape",
                              labels=["shard"]))


def _pool_families() -> tuple[Metric, ...]:
    """Per executor pool: usage, blocks by state, prefix hit rate, looked-up and hit tokens."""
    return (GaugeMetricFamily("pagedserve_kv_usage_ratio", "Used KV blocks over the pool's "
                              "blocks", labels=["executor"]),
            GaugeMetricFamily("pagedserve_kv_blocks", "KV blocks by state",
                              labels=["executor", "state"]),
            GaugeMetricFamily("pagedserve_prefix_cache_hit_rate", "Prompt tokens found in the "
                              "prefix cache over those looked up", labels=["executor"]),
            CounterMetricFamily("pagedserve_prefix_cache_query_tokens",
                                "Prompt tokens looked up in the prefix cache",
                                labels=["executor"]),
            CounterMetricFamily("pagedserve_prefix_cache_hit_tokens",
                                "Prompt tokens found in the prefix cache", labels=["executor"]))


def _executor_families() -> tuple[Metric, ...]:
    """Per executor: preemptions, allocator stalls, requests by state."""
    return (CounterMetricFamily("pagedserve_executor_preemptions",
                                "Sequences preempted for lack of KV blocks", labels=["executor"]),
            CounterMetricFamily("pagedserve_executor_allocator_stalls",
                                "Iterations that waited on the allocator", labels=["executor"]),
            GaugeMetricFamily("pagedserve_executor_requests", "Requests in the executor, by "
                              "state", labels=["executor", "state"]))
