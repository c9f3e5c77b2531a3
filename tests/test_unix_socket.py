"""Redis over a Unix socket (`unix:///path.sock`): the clients, a worker and a dispatcher as
real processes, and the commands packed by hiredis as on TCP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker import AsyncReachClient, ReachClient
from broker.infra import connection
from broker.infra.embedded import EmbeddedRedis
from broker.settings import Settings
from tests.conftest import FAST, Fleet

PAYLOAD = {"text": "naïve café, 東京, emoji 🛰", "n": 3, "ratio": 0.25}


@pytest.fixture(scope="module")
def unix_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # (Short: a Unix socket path is limited to about a hundred bytes.)
    sock = tmp_path_factory.mktemp("unix") / "r.sock"
    server = EmbeddedRedis(extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"]).start()
    try:
        yield f"unix://{sock}"
    finally:
        server.stop()


@pytest.fixture
def unix_settings(unix_url: str) -> Settings:
    return Settings.load(redis_url=unix_url, prefix="unixtest", **FAST)


def test_unix_socket_clients_pack_with_hiredis(unix_settings: Settings) -> None:
    sync = connection.sync_client(unix_settings)
    aio = connection.async_client(unix_settings)
    try:
        for client, unix_class in ((sync, redis.UnixDomainSocketConnection),
                                   (aio, redis.asyncio.UnixDomainSocketConnection)):
            made = client.connection_pool.connection_class
            assert issubclass(made, unix_class)
            assert made.pack_command is connection._HiredisPacking.pack_command
        sync.set("unixtest:k", "é")
        assert sync.get("unixtest:k") == "é"
    finally:
        sync.close()
        asyncio.run(aio.aclose())


def test_tasks_run_over_a_unix_socket(unix_settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(unix_settings, tmp_path)
    try:
        fleet.worker("echo")
        fleet.dispatcher("echo")
        with ReachClient(unix_settings) as client:
            assert client.submit("echo", PAYLOAD).result(timeout=20) == PAYLOAD

        async def over_asyncio() -> object:
            async with AsyncReachClient(unix_settings) as aclient:
                handle = await aclient.submit("echo", PAYLOAD, metadata={"from": "ünïx"})
                return await handle.result(timeout=20)

        assert asyncio.run(over_asyncio()) == PAYLOAD
    finally:
        fleet.stop_all()
