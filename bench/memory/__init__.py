"""Memory benchmark: KV slots holding tokens, paged against contiguous reservation."""
