"""Sentinel-managed Redis: `redis+sentinel://` URLs, and a master failover mid-run."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import ConfigError, ReachClient, Settings
from broker.infra.connection import parse_sentinel_url
from broker.infra.embedded import EmbeddedRedis, free_port, redis_server_binary
from tests.conftest import FAST, Fleet, wait_until


class LocalSentinel:
    def __init__(self, master_port: int, folder: Path) -> None:
        self.port = free_port()
        self.conf = folder / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor reachmaster 127.0.0.1 {master_port} 1\n"
            "sentinel down-after-milliseconds reachmaster 1000\n"
            "sentinel failover-timeout reachmaster 5000\n"
        )
        self.process = subprocess.Popen([redis_server_binary(), str(self.conf), "--sentinel"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        wait_until(lambda: _answers(client), timeout=10, message="sentinel up")
        self.client = client

    def master_port(self) -> int:
        _host, port = self.client.sentinel_get_master_addr_by_name("reachmaster")
        return int(port)

    def stop(self) -> None:
        self.client.close()
        self.process.kill()
        self.process.wait(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


def test_sentinel_url_parsing() -> None:
    target = parse_sentinel_url("redis+sentinel://app:s3cret@h1:26379,h2:26380/mymaster/2")
    assert target.sentinels == [("h1", 26379), ("h2", 26380)] and target.service == "mymaster"
    assert (target.db, target.username, target.password) == (2, "app", "s3cret")
    assert parse_sentinel_url("redis+sentinel://h1/m").sentinels == [("h1", 26379)]
    with pytest.raises(ConfigError, match="invalid Sentinel URL"):
        parse_sentinel_url("redis+sentinel://h1:26379")


def test_a_fleet_behind_sentinel_rides_out_a_master_failover(tmp_path: Any) -> None:
    master = EmbeddedRedis().start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    sentinel = LocalSentinel(master.port, tmp_path)
    prefix = f"sn{secrets.token_hex(3)}"
    settings = Settings.load(redis_url=f"redis+sentinel://127.0.0.1:{sentinel.port}/reachmaster/0",
                             prefix=prefix, **FAST)
    fleet = Fleet(settings, tmp_path)
    try:
        fleet.dispatcher()
        fleet.worker("echo")
        with ReachClient(settings) as client:
            assert client.run("echo", {"before": 1}, timeout=30) == {"before": 1}
            # Let the replica catch up with every write so far, then lose the master.
            primary, copy = redis.Redis(port=master.port), redis.Redis(port=replica.port)
            wait_until(lambda: copy.info("replication").get("master_link_status") == "up"
                       and copy.info("replication")["master_repl_offset"]
                       >= primary.info("replication")["master_repl_offset"],
                       message="replica in sync")
            master.kill()
            wait_until(lambda: sentinel.master_port() == replica.port, timeout=30,
                       message="sentinel promoted the replica")
            assert client.run("echo", {"after": 1}, timeout=60) == {"after": 1}
        assert all(p.popen.poll() is None for p in fleet.procs), "nobody crashed"
    finally:
        fleet.stop_all()
        sentinel.stop()
        replica.stop()
        master.stop()
