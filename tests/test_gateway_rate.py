"""The gateway's rate limit over real HTTP: a token bucket per API key (per client address for
calls without a key) in Redis, shared by every gateway process; over it, 429 rate_limited with
Retry-After."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from broker.settings import Settings
from gateway.apikeys import Role, create_key
from tests.conftest import Fleet, sync_redis, wait_until
from tests.gateway_helpers import start_gateway

pytestmark = pytest.mark.one_redis


def _get(url: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}/v1/agents", headers=headers, timeout=30)


def _assert_limited(response: httpx.Response, limit: str) -> int:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "rate_limited" and f"rate limit of {limit} requests a second" in error["message"]
    wait = int(response.headers["Retry-After"])
    assert 1 <= wait <= 60
    return wait


def test_without_keys_each_address_has_a_bucket(make_settings: Callable[..., Settings], fleet: Fleet) -> None:
    settings = make_settings(gateway_rate_limit=0.2, gateway_rate_burst=3)
    _, url = start_gateway(fleet, settings)
    assert [_get(url).status_code for _ in range(3)] == [200, 200, 200]
    assert 3 <= _assert_limited(_get(url), "0.2") <= 5  # (a token every 5 s)
    submit = httpx.post(f"{url}/v1/tasks", json={"capability": "cap", "payload": {}}, timeout=30)
    _assert_limited(submit, "0.2")
    assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200  # (health checks are not limited)


def test_each_key_has_its_own_bucket_shared_by_every_gateway(
        make_settings: Callable[..., Settings], fleet: Fleet) -> None:
    settings = make_settings(gateway_rate_limit=0.5, gateway_rate_burst=2)
    client: Any = sync_redis(settings.redis_url)
    try:
        first, _ = create_key(client, settings, Role.PRODUCER, "first")
        second, _ = create_key(client, settings, Role.READER, "second")
    finally:
        client.close()
    _, one = start_gateway(fleet, settings)
    _, two = start_gateway(fleet, settings)
    assert _get(one, first).status_code == 200
    assert _get(two, first).status_code == 200  # (the same bucket, through another gateway)
    _assert_limited(_get(one, first), "0.5")
    _assert_limited(_get(two, first), "0.5")
    assert [_get(two, second).status_code, _get(one, second).status_code] == [200, 200]
    assert _get(one).status_code == 401  # (no key: refused before any bucket is touched)
    # (a token every 2 s: the bucket refills; a refused call takes none)
    wait_until(lambda: _get(one, first).status_code == 200, 10, interval=0.2, message="a refill")


def test_no_limit_by_default(settings: Settings, fleet: Fleet) -> None:
    _, url = start_gateway(fleet)
    assert {_get(url).status_code for _ in range(30)} == {200}
