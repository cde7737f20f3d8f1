"""Runs a real `redis-server` as a subprocess on a loopback port, for integration tests and benches.

    with RedisProcess(tmp_path) as redis_server:
        client = redis_server.client()
        client.set(b"k", b"v")
        redis_server.kill()        # SIGKILL: nothing flushed that was not already on disk
        redis_server.restart()     # same port, same data dir, same settings
        assert client.get(b"k") == b"v"   # appendonly yes + appendfsync always: it survived

Redis is configured on the command line only (no config file), so a test sees every setting in
one place and nothing from /etc/redis leaks in. By default the append-only file is on with
`appendfsync always` and RDB snapshots are off, so what survives a `kill()` is exactly what Redis
acknowledged. `aof_rewrite=False` turns off Redis's automatic rewrites of that file (a forked
child that writes the whole dataset, each time the file has doubled), for a benchmark whose data
only grows. Redis 7 keeps the append-only file as several files under `<data_dir>/appendonlydir/`;
a restart reuses the same data dir, so the data comes back.

Redis logs to `<data_dir>/redis.log`. Errors it meets before it opens that file (a bad argument,
`--dir` that is not a directory) go to its stderr, which a background thread drains, so a full
pipe never blocks it. A `RedisStartError` message ends with both.

Every started server is stopped when its `with` block ends, by `stop()`, or at interpreter exit.
"""
from __future__ import annotations

import atexit
import collections
import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pagedserve.supervisor.supervised import stop_gracefully

REDIS_SERVER = "/usr/bin/redis-server"
HOST = "127.0.0.1"
LOG_NAME = "redis.log"
LOG_TAIL_LINES = 30
# How many fresh ports to try when a port we picked ourselves was taken before Redis bound it.
PORT_ATTEMPTS = 3


class RedisStartError(RuntimeError):
    """redis-server exited, or did not answer PING in time; the message ends with its log."""


# Servers that are running; the atexit hook below stops whatever a test forgot to.
_RUNNING: set[RedisProcess] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    for server in list(_RUNNING):
        server.stop()


def free_port() -> int:
    """A loopback port that was free a moment ago (another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class RedisProcess:
    """One redis-server subprocess; started by the constructor, stopped by `stop()` or `with`.

    `restart()` starts it again on the same port, data dir and settings, after `stop()`, after
    `kill()`, or while it runs (it stops it gracefully first).
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, appendonly: bool = True,
                 appendfsync: str = "always", save: str = "", aof_rewrite: bool = True,
                 startup_timeout_s: float = 15.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.save = save
        self.aof_rewrite = aof_rewrite
        self.startup_timeout_s = startup_timeout_s
        self.log_path = self.data_dir / LOG_NAME
        self.process: subprocess.Popen[str] | None = None
        self._output: collections.deque[str] = collections.deque(maxlen=200)
        self._output_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._clients: list[redis.Redis] = []
        # Create a missing data dir, but leave one that exists as something else (a regular file)
        # for Redis to reject, so that a misconfigured test fails with Redis's own words.
        if not self.data_dir.exists():
            self.data_dir.mkdir(parents=True)

        if port is not None:
            self._port = port
            self._start()
            return
        # We picked the port, so a clash is a race with some other process: try a fresh one.
        for attempt in range(PORT_ATTEMPTS):
            self._port = free_port()
            try:
                self._start()
                return
            except RedisStartError as error:
                if attempt == PORT_ATTEMPTS - 1 or not _address_in_use(error):
                    raise

    # -- settings ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return self.url_for_db(0)

    def url_for_db(self, db: int) -> str:
        return f"redis://{HOST}:{self._port}/{db}"

    @property
    def args(self) -> list[str]:
        return [
            REDIS_SERVER,
            "--bind", HOST,
            "--port", str(self._port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", self.save,  # "" turns RDB snapshots off (also the one at shutdown)
            # 0 turns the automatic rewrites off; 100 (Redis's default): at each doubling.
            "--auto-aof-rewrite-percentage", "100" if self.aof_rewrite else "0",
            "--protected-mode", "no",
            "--daemonize", "no",  # we need the pid we started to be the server's
            "--logfile", str(self.log_path),
        ]

    # -- start-up ------------------------------------------------------------------------------

    def _start(self) -> None:
        # The log file is appended to across restarts; remember where this run's lines begin.
        self._log_offset = self.log_path.stat().st_size if self.log_path.is_file() else 0
        with self._output_lock:
            self._output.clear()
        self.process = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        _RUNNING.add(self)
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._drain, args=(self.process.stdout,),
                                        name=f"redis-{self._port}-output", daemon=True)
        self._reader.start()
        try:
            self._wait_ready(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            with self._output_lock:
                self._output.append(line)

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        # No retries: this loop is the retry, and it must notice at once when the process dies.
        probe = redis.Redis(host=HOST, port=self._port, socket_connect_timeout=0.5,
                            socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if self.process.poll() is not None:
                    raise self._start_error("exited before answering PING", exited=True)
                try:
                    # PING alone could be answered by some other server on this port; the pid
                    # proves it is ours. While Redis loads its AOF it answers -LOADING (an error).
                    if probe.ping() and probe.info("server")["process_id"] == self.process.pid:
                        return
                except (redis.exceptions.RedisError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise self._start_error(f"did not answer PING within {timeout_s:.0f}s")
                time.sleep(0.02)
        finally:
            probe.close()

    def _start_error(self, what: str, exited: bool = False) -> RedisStartError:
        assert self.process is not None
        if exited:  # reap it and let the last of its output arrive
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
            if self._reader is not None:
                self._reader.join(timeout=2.0)
        output = self.output_tail()
        parts = [f"redis-server on {HOST}:{self._port} {what} "
                 f"(exit code {self.process.poll()}); command: {shlex.join(self.args)}"]
        if output.strip():
            parts.append(f"stdout/stderr tail:\n{output.rstrip()}")
        parts.append(f"log tail ({self.log_path}):\n{self.log_tail(this_run_only=True)}")
        return RedisStartError("\n".join(parts))

    # -- use -----------------------------------------------------------------------------------

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        """A new `redis.Redis` (bytes replies) to this server; it reconnects across restarts.

        `kwargs` override the defaults, e.g. `retry=Retry(NoBackoff(), 0)` to fail at once.
        Closed when the `with` block ends.
        """
        options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        options.update(kwargs)
        client = redis.Redis(host=HOST, port=self._port, db=db, decode_responses=False, **options)
        self._clients.append(client)
        return client

    def log_tail(self, lines: int = LOG_TAIL_LINES, this_run_only: bool = False) -> str:
        """The last `lines` lines of redis.log (of this start only, if `this_run_only`)."""
        try:
            with open(self.log_path, "rb") as log:
                if this_run_only:
                    log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError as error:
            return f"<no log: {error}>"
        return "".join(text.splitlines(keepends=True)[-lines:]) or "<empty>"

    def output_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines redis-server wrote to stdout/stderr (only early fatal errors, normally)."""
        with self._output_lock:
            return "".join(list(self._output)[-lines:])

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- shutdown and restart ------------------------------------------------------------------

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit code. Idempotent.

        On SIGTERM Redis flushes and fsyncs the append-only file before it exits.
        """
        if self.process is None:
            return None
        stop_gracefully(self.process, timeout_s)
        self._finish()
        return self.process.returncode

    def kill(self) -> int | None:
        """SIGKILL, like a crash or power loss of the process: no flush, no fsync, no goodbye."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._finish()
        return self.process.returncode

    def restart(self) -> None:
        """Start again on the same port, data dir and settings; stops gracefully if running."""
        self.stop()
        self._start()

    def _finish(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=2.0)
            # The next start opens a new pipe; close this one rather than leave it to the GC.
            # Not while the reader still blocks on it (a forked child of Redis may hold it
            # open): close() would wait for that read.
            if (not self._reader.is_alive() and self.process is not None
                    and self.process.stdout is not None):
                self.process.stdout.close()
            self._reader = None
        _RUNNING.discard(self)

    def close(self) -> None:
        """`stop()`, and close the clients made by `client()`."""
        try:
            self.stop()
        finally:
            for client in self._clients:
                client.close()
            self._clients.clear()

    def __enter__(self) -> RedisProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _address_in_use(error: RedisStartError) -> bool:
    return "Address already in use" in str(error)
