"""Resident memory of every process of the soak, sampled every few seconds, and whether it
stayed put.

RSS comes from /proc/PID/status (VmRSS), so no extra package is needed; off Linux there are no
samples and the memory check says so. A process is followed by name, not pid: the allocator's
pid changes when the soak restarts it, and its line continues.

Stable means: the mean RSS of the last 20 % of the run is less than `MAX_GROWTH` above the mean
of the 20-40 % window. The first 20 % is warm-up (caches, arenas, the first batches of every
size); comparing two windows rather than two samples keeps one garbage-collection spike from
deciding. Runs shorter than `MIN_JUDGED_S` are reported but not judged: their windows are a
few samples of warm-up.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_GROWTH = 0.05
MIN_JUDGED_S = 120.0
EARLY = (0.2, 0.4)
LATE = (0.8, 1.0)


@dataclass(slots=True)
class MemorySamples:
    # Seconds since the load began, per sample.
    times: list[float] = field(default_factory=list)
    # MiB per process name, one per sample (None: the process was not there, e.g. restarting).
    rss_mib: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Growth:
    process: str
    start_mib: float       # the first sample
    early_mib: float       # mean over EARLY
    late_mib: float        # mean over LATE
    end_mib: float         # the last sample

    @property
    def growth_mib(self) -> float:
        return self.late_mib - self.early_mib

    @property
    def growth_share(self) -> float:
        return self.growth_mib / self.early_mib if self.early_mib else 0.0

    @property
    def stable(self) -> bool:
        return self.growth_share < MAX_GROWTH


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class RssSampler:
    """Samples `pids()` every `every_s` seconds on a thread, from `start()` to `stop()`."""

    def __init__(self, pids: Callable[[], dict[str, int]], every_s: float) -> None:
        self.samples = MemorySamples()
        self._pids = pids
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._began = 0.0

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> MemorySamples:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self._every_s):
                self.sample()   # the last moment of the run too
                return

    def sample(self) -> None:
        samples = self.samples
        at = time.monotonic() - self._began
        pids = self._pids()
        for name in pids:
            samples.rss_mib.setdefault(name, [None] * len(samples.times))
        samples.times.append(at)
        for name, series in samples.rss_mib.items():
            series.append(rss_mib(pids[name]) if name in pids else None)


def growth(samples: MemorySamples) -> list[Growth]:
    """Per process, early and late windows' mean RSS (processes without samples are left out)."""
    if not samples.times:
        return []
    span = samples.times[-1] or 1.0
    found = []
    for name, series in samples.rss_mib.items():
        present = [value for value in series if value is not None]
        early = window(samples.times, series, span, EARLY)
        late = window(samples.times, series, span, LATE)
        if present and early is not None and late is not None:
            found.append(Growth(name, present[0], early, late, present[-1]))
    return found


def window(times: list[float], series: list[float | None], span: float,
           share: tuple[float, float]) -> float | None:
    values = [value for at, value in zip(times, series)
              if value is not None and share[0] * span <= at <= share[1] * span]
    return statistics.fmean(values) if values else None


def sample_interval(duration_s: float) -> float:
    """Every 2 s, or more often in a short run (at least about 200 samples)."""
    return min(2.0, max(0.25, duration_s / 200))
