"""The context window an engine serves: the model's, unless its KV cache cannot hold one
sequence that long.

A sequence needs a slot for every token it writes plus `lookahead_slots` reserved ahead, and
it cannot be split across executors, so one that outgrows the whole cache has nowhere to go: it
used to end with an error mid-stream once it got there. Serving the smaller window instead makes
it end with finish reason "length", and lets the gateway refuse a prompt and `max_tokens` that
cannot fit before any token is spent. A window asked for explicitly (`--max-model-len`) that the
cache cannot hold is refused at start-up, as the operator asked for something this cache cannot
give.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class WindowOverCache(ValueError):
    """The KV cache cannot hold one sequence of the context window asked for."""


def served_window(window: int, *, explicit: bool, num_blocks: int, block_size: int,
                  lookahead_slots: int) -> int:
    slots = num_blocks * block_size
    fits = slots - lookahead_slots
    if window <= fits:
        return window
    cache = (f"the KV cache holds {slots} token slots ({num_blocks} blocks of {block_size}), "
             f"{lookahead_slots} of which a sequence keeps reserved ahead")
    more = "--num-blocks, --kv-cache-memory or --gpu-memory-utilization"
    if fits < 2:
        raise WindowOverCache(f"{cache}: too small to serve any sequence; give it more with "
                              f"{more}")
    if explicit:
        raise WindowOverCache(f"--max-model-len {window} does not fit: {cache}; lower it to "
                              f"at most {fits} or give the cache more with {more}")
    log.warning("serving a context window of %d tokens, not the model's %d: %s", fits, window,
                cache)
    return fits
