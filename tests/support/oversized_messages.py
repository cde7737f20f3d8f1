"""A message over the size every pagedserve server accepts, and a channel willing to send it, so
that the server (not the client's own send limit) is what refuses it."""
from __future__ import annotations

import grpc

from pagedserve.common.server import MAX_MESSAGE_BYTES

# One MiB past the servers' receive limit (grpc.max_receive_message_length).
OVERSIZED_CHARS = MAX_MESSAGE_BYTES + (1 << 20)
# What the server's refusal says (grpc's own words, prefixed "SERVER: " or not).
OVERSIZED_MESSAGE = "Received message larger than max"
OVERSIZED_INPUT = (f"a message of {OVERSIZED_CHARS >> 20} MiB (servers take at most "
                   f"{MAX_MESSAGE_BYTES >> 20} MiB)")


def oversized_channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(
        target, options=[("grpc.max_send_message_length", 2 * OVERSIZED_CHARS)])
