"""A client channel keeps trying to reach a server that went away, about once a second.

gRPC's default waits 1.6 times longer after each failed attempt (up to 120 s), so a client of a
server that was down for half a minute reached it only 11 s after it came back: longer than an
executor's lease on a restarted allocator. The server here is a listener that accepts each
connection and closes it at once (a failed attempt to the client); it counts the attempts.
"""
from __future__ import annotations

import socket
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.common.client import open_channel

WATCH_S = 10.0      # the client calls this long; the default backoff tries at ~1, 2.6, 5.2, 9.3 s
LATE_FROM_S = 4.0   # attempts counted from here on: the default makes one or two, ours six or so


def test_a_channel_to_a_server_that_is_away_keeps_trying_every_second() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    attempts: list[float] = []
    stop = threading.Event()

    def refuse_each_connection() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            attempts.append(time.monotonic())
            connection.close()

    watcher = threading.Thread(target=refuse_each_connection, daemon=True)
    watcher.start()
    channel = open_channel(f"127.0.0.1:{listener.getsockname()[1]}")
    stub = health_pb2_grpc.HealthStub(channel)
    started = time.monotonic()
    try:
        while time.monotonic() - started < WATCH_S:
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    finally:
        stop.set()
        channel.close()
        watcher.join()
        listener.close()
    late = [at for at in attempts if at - started >= LATE_FROM_S]
    assert len(late) >= 4, (f"{len(late)} attempts to connect from {LATE_FROM_S:.0f} s to "
                            f"{WATCH_S:.0f} s of an outage ({len(attempts)} in all)")
