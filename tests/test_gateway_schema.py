"""A property-based run of the API against its own OpenAPI schema (schemathesis, on hypothesis):
requests generated from the schema, valid and not, against a real gateway and Redis, must
never get a 5xx, and every error must be JSON of the one shape."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from broker.settings import Settings
from gateway.app import create_app
from tests.conftest import FAST, Fleet, _delete_prefix
from tests.gateway_helpers import start_gateway

pytestmark = pytest.mark.one_redis

# (The schema as the app makes it: it needs no Redis, and the same app serves it at /openapi.json.)
schema = schemathesis.openapi.from_dict(create_app(Settings.load()).openapi())


@pytest.fixture(scope="module")
def gateway_url(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    prefix = f"t{secrets.token_hex(4)}"
    settings = Settings.load(redis_url=redis_url, prefix=prefix, **FAST)
    fleet = Fleet(settings, tmp_path_factory.mktemp("schema"))
    try:
        _, url = start_gateway(fleet)
        yield url
        gateway_log = fleet.procs[0].output()
        assert "Traceback" not in gateway_log, gateway_log[-3000:]
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: Any, gateway_url: str) -> None:
    response = case.call(base_url=gateway_url, timeout=30)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
