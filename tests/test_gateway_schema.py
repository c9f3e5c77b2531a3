"""A property-based run of the API against its own OpenAPI document: hypothesis draws requests
for every operation from its schemas, valid and not (tests/openapi_strategies.py), and sends
them to a real gateway and Redis. None may get a 5xx; every error is JSON of the one shape.

(schemathesis does this too, but needs rich >= 13.9.4, above the floor this project declares.)
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import codec
from broker.settings import Settings
from gateway.app import create_app
from tests.conftest import FAST, Fleet, _delete_prefix
from tests.gateway_helpers import start_gateway
from tests.openapi_strategies import (
    Operation,
    from_schema,
    header_value,
    invalid_body,
    operations,
    path_value,
)

pytestmark = pytest.mark.one_redis

# (The document as the app makes it: it needs no Redis; the gateway serves the same one.)
DOCUMENT = create_app(Settings.load()).openapi()
OPERATIONS = operations(DOCUMENT)


@pytest.fixture(scope="module")
def http(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    prefix = f"t{secrets.token_hex(4)}"
    fleet = Fleet(Settings.load(redis_url=redis_url, prefix=prefix, **FAST), tmp_path_factory.mktemp("api"))
    try:
        gateway, url = start_gateway(fleet)
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/openapi.json").json() == DOCUMENT
            yield client
        assert "Traceback" not in gateway.output(), gateway.output()[-3000:]
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)


def _request(draw: Any, op: Operation) -> dict[str, Any]:
    components = op.components
    path = op.path
    for param in op.parameters("path"):
        path = path.replace("{" + param["name"] + "}", draw(path_value(param["schema"], components)))
    params = {}
    for param in op.parameters("query"):
        if draw(st.booleans()):
            value = draw(from_schema(param["schema"], components) | header_value())
            if value is not None:
                params[param["name"]] = str(value).lower() if isinstance(value, bool) else str(value)
    headers = {}
    for param in op.parameters("header"):
        if draw(st.booleans()):
            headers[param["name"]] = draw(header_value())
    for name in ("Authorization", "X-Reach-Callback-Token"):  # (rarely: a wrong one is just a 401)
        if draw(st.integers(0, 4)) == 0:
            headers[name] = draw(header_value())
    request: dict[str, Any] = {"method": op.method.upper(), "url": path, "params": params, "headers": headers}
    schema = op.body_schema()
    if schema is not None:
        kind = draw(st.sampled_from(["valid", "valid", "invalid", "raw"]))
        if kind == "raw":
            request["content"] = draw(st.binary(max_size=200))
        else:
            valid = kind == "valid"
            strategy = from_schema(schema, components) if valid else invalid_body(schema, components)
            request["content"] = codec.dumps(draw(strategy)).encode()
        headers["Content-Type"] = "application/json"
    return request


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.id)
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_request_gets_a_server_error(http: httpx.Client, op: Operation, data: st.DataObject) -> None:
    request = data.draw(st.composite(lambda draw: _request(draw, op))())
    with http.stream(**request) as response:  # (a stream that opens is not read to its end)
        status = response.status_code
        body = response.read() if status >= 400 else b""
    assert status < 500, f"{request['method']} {request['url']}: {status} {body[:300]!r}"
    if status >= 400:
        error = codec.loads(body)["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
