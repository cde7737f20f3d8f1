"""Tests of the redis-server helper itself (pagedserve/supervisor/redis_server.py), on a real Redis."""
from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pagedserve.supervisor import redis_server as redis_server_module
from pagedserve.supervisor.redis_server import HOST, RedisProcess, RedisStartError

pytestmark = pytest.mark.skipif(shutil.which(redis_server_module.REDIS_SERVER) is None,
                                reason="redis-server is not installed")


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port with a listening socket on it that this test holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_starts_round_trips_a_value_and_stop_leaves_no_process(tmp_path: Path) -> None:
    with RedisProcess(tmp_path) as server:
        process = server.process
        assert server.is_running
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = server.client()
        assert client.set(b"key", b"value")
        assert client.get(b"key") == b"value"
        with redis.Redis.from_url(server.url_for_db(3)) as db3:
            assert db3.ping()
            assert db3.client_info()["db"] == 3
        # CONFIG GET replies come back as str even with decode_responses=False.
        assert client.config_get("save") == {"save": ""}  # no RDB snapshots
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
    assert process is not None and process.poll() is not None
    assert not server.is_running
    assert server.stop() == process.returncode  # idempotent


def test_appendonly_always_data_survives_kill_and_restart_on_same_port(tmp_path: Path) -> None:
    with RedisProcess(tmp_path, appendonly=True, appendfsync="always") as server:
        port, first_pid = server.port, server.pid
        server.client().set(b"durable", b"yes")
        server.kill()
        assert not server.is_running
        server.restart()
        assert server.port == port and server.pid != first_pid
        assert server.client().get(b"durable") == b"yes"
        # Redis 7 keeps the AOF as a manifest plus base/incr files in a directory of its own.
        assert (tmp_path / "appendonlydir").is_dir()


def test_without_persistence_data_is_gone_after_kill_and_restart(tmp_path: Path) -> None:
    with RedisProcess(tmp_path, appendonly=False, save="") as server:
        server.client().set(b"volatile", b"yes")
        server.kill()
        server.restart()
        assert server.client().get(b"volatile") is None
        assert server.client().dbsize() == 0


def test_automatic_aof_rewrites_are_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    with RedisProcess(tmp_path / "default") as default, \
            RedisProcess(tmp_path / "off", aof_rewrite=False) as off:
        setting = "auto-aof-rewrite-percentage"
        assert default.client().config_get(setting) == {setting: "100"}
        assert off.client().config_get(setting) == {setting: "0"}


def test_client_command_raises_connection_error_while_stopped(tmp_path: Path) -> None:
    with RedisProcess(tmp_path) as server:
        # redis-py's default Retry (10 tries, jittered backoff up to 1 s) would take ~4 s to give
        # up on a dead server; without retries the refused connect fails at once.
        no_retry = server.client(retry=Retry(NoBackoff(), 0))
        default = server.client()
        assert no_retry.ping() and default.ping()
        server.stop()
        started = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            no_retry.get(b"key")
        assert time.monotonic() - started < 1.0
        server.restart()
        # The default client's pooled connection died with the old process; its retry
        # reconnects to the new one on the same port.
        assert default.ping()


def test_port_already_in_use_raises_start_error_with_log_tail(tmp_path: Path,
                                                               held_port: int) -> None:
    with pytest.raises(RedisStartError) as raised:
        RedisProcess(tmp_path, port=held_port)
    message = str(raised.value)
    assert "exited before answering PING" in message
    assert "Address already in use" in message  # from the log tail
    assert message.rstrip().endswith(
        (tmp_path / "redis.log").read_text().splitlines()[-1].rstrip())
    assert not redis_server_module._RUNNING


def test_data_dir_that_is_a_file_raises_start_error_with_redis_stderr(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(RedisStartError, match="Not a directory"):
        RedisProcess(not_a_dir)


def test_picked_port_taken_by_someone_else_is_retried_on_a_fresh_port(
        tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([held_port])
    real_free_port = redis_server_module.free_port
    monkeypatch.setattr(redis_server_module, "free_port", lambda: next(picks, None) or real_free_port())
    with RedisProcess(tmp_path) as server:
        assert server.port != held_port
        assert server.client().ping()
        assert "Address already in use" in (tmp_path / "redis.log").read_text()


def test_exit_with_error_in_body_still_stops_the_server(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with RedisProcess(tmp_path) as server:
            raise KeyError("boom")
    assert server.process is not None and server.process.poll() is not None
    assert server not in redis_server_module._RUNNING
