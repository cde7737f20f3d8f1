"""What the durability benchmark runs: the three allocator configurations, the sizes of each part,
and the settings every allocator it starts shares."""
from __future__ import annotations

from dataclasses import dataclass

from allocator_service.server.config import build_parser

TARGET_RATIO = 1.5
TARGET_BATCH = 256
# Long enough that no pool is reclaimed while its allocator waits for its turn.
LEASE_TTL = "3600"
# `--snapshot-every` for every allocator whose Steps are timed: the Step that starts a snapshot
# forks the process (milliseconds), and the child then takes a core to capture, encode and write
# it; either would land in whichever percentile it fell in. The snapshot's cost is measured on its
# own, in the recovery part.
NO_SNAPSHOTS = 10**9
# What a spawned allocator gets without the flag: the default in allocator_service/server/config.py (the
# harness strips PAGEDSERVE_* from the allocators' environment; only this process reads it here).
DEFAULT_SNAPSHOT_EVERY: int = build_parser().get_default("snapshot_every")


@dataclass(slots=True, frozen=True)
class Config:
    name: str
    label: str
    # None: in memory, no Redis.
    appendfsync: str | None
    color: str


CONFIGS = (Config("memory", "in memory", None, "#4c72b0"),
           Config("everysec", "Redis, appendfsync everysec", "everysec", "#dd8452"),
           Config("always", "Redis, appendfsync always", "always", "#c44e52"))
DURABLE = CONFIGS[1:]


@dataclass(slots=True, frozen=True)
class Sizes:
    num_blocks: int = 16_384
    block_size: int = 16
    # Decode appends per Step. Each batch size gets a pool of its own, of sequences with
    # 128-token prompts: at 256 sequences it holds about 850 steps.
    batches: tuple[int, ...] = (1, 16, 64, 256)
    latency_warmup_steps: int = 50
    latency_steps: int = 800
    handler_steps: int = 400
    mix_warmup_steps: int = 300
    mix_steps: int = 1_500
    # Serving-mix steps journaled before each kill (cumulative), then after the snapshot.
    journal_steps: tuple[int, ...] = (1_000, 10_000)
    # A snapshot plus a full interval of journal is the longest a restart at the default replays.
    snapshot_tail_steps: int = DEFAULT_SNAPSHOT_EVERY
    # Kill-and-restart cycles per recovery point (the median is reported).
    restarts: int = 5


QUICK = Sizes(batches=(1, 256), latency_warmup_steps=3, latency_steps=20, handler_steps=10,
              mix_warmup_steps=5, mix_steps=20, journal_steps=(20, 60), snapshot_tail_steps=20,
              restarts=1)
