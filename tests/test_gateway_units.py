"""The gateway's and the HTTP bridge's pure parts, without Redis or processes."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import pytest

from agent_worker.errors import InvalidRequest, Retryable
from agent_worker.http_bridge.options import BridgeOptions, parse_header, ready_url
from agent_worker.http_bridge.outcome import AgentFailed, interpret, retry_after_s
from agent_worker.http_bridge.readiness import Probe
from broker.errors import ConfigError
from broker.protocol.callbacks import new_token, parse_token, token_sha256
from broker.protocol.submit import SubmitOptions
from gateway.addresses import is_loopback, parse_addr
from gateway.apikeys import KeyRecord, Role, key_sha256, parse_role
from gateway.models import SubmitBody, TaskOptions


def _raised(status: int, body: bytes, headers: dict[str, str] | None = None) -> BaseException:
    with pytest.raises(Exception) as caught:
        interpret(status, body, headers)
    return caught.value


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_these_http_statuses_are_retryable(status: int) -> None:
    assert isinstance(_raised(status, b""), Retryable)


@pytest.mark.parametrize("status, kind", [(400, InvalidRequest), (404, InvalidRequest), (422, InvalidRequest),
                                          (501, AgentFailed), (505, AgentFailed)])
def test_other_4xx_are_invalid_requests_and_other_5xx_failures(status: int, kind: type) -> None:
    assert isinstance(_raised(status, b"no"), kind)


def test_the_business_status_decides_before_the_http_status() -> None:
    assert interpret(500, b'{"status": "success", "result": 7}') == 7
    assert isinstance(_raised(200, b'{"status": "failure", "error": "no"}'), AgentFailed)
    assert isinstance(_raised(503, b'{"status": "invalid_request"}'), InvalidRequest)
    assert interpret(201, b'{"anything": 1}') == {"anything": 1}
    assert interpret(204, b"") is None
    hinted = _raised(200, b'{"status": "retryable_failure", "retry_after_s": 4}')
    assert isinstance(hinted, Retryable) and hinted.retry_after_s == 4


def test_retry_after_is_honoured_as_seconds_or_a_date() -> None:
    raised = _raised(429, b"slow down", {"retry-after": "7"})
    assert isinstance(raised, Retryable) and raised.retry_after_s == 7
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= (retry_after_s(date) or 0) <= 30
    assert retry_after_s("soon") is None and retry_after_s(None) is None
    assert retry_after_s("99999999") == 86_400


def test_header_values_expand_environment_variables_and_stay_hidden() -> None:
    env = {"AGENT_TOKEN": "t0k3n"}
    assert parse_header("Authorization: Bearer ${AGENT_TOKEN}", env) == ("Authorization", "Bearer t0k3n")
    with pytest.raises(ConfigError, match=r"\$\{MISSING\}"):
        parse_header("X-Key: ${MISSING}", env)
    for bad in ("no colon", "Bad Name: v", "X-Reach-Task-Id: mine", "Content-Type: text/plain"):
        with pytest.raises(ConfigError):
            parse_header(bad, env)
    options = BridgeOptions.build(["Authorization: Bearer ${AGENT_TOKEN}"], environ=env)
    assert "t0k3n" not in repr(options) and "Authorization" in repr(options)


def test_readiness_urls_and_probes() -> None:
    assert ready_url("auto", "http://127.0.0.1:9001/process?x=1") == "http://127.0.0.1:9001/ready"
    assert str(Probe.for_agent("http://a:9/p", None)) == "connect a:9"
    assert str(Probe.for_agent("https://a/p", None)) == "connect a:443"
    assert str(Probe.for_agent("http://a:9/p", "auto")) == "GET http://a:9/ready"
    with pytest.raises(ConfigError):
        BridgeOptions.build(ready="ftp://x")
    with pytest.raises(ConfigError):
        BridgeOptions.build(callback_url="not a url")


def test_a_callback_token_names_its_fence() -> None:
    token, sha = new_token("12")
    parsed = parse_token(token)
    assert parsed is not None and parsed.fence == "12" and parsed.sha256 == sha == token_sha256(token)
    for bad in ("", "12", "x.abcdefghijklmnopqrstuvwxyz", "12.short", "1" * 30 + "." + "a" * 32):
        assert parse_token(bad) is None


@pytest.mark.parametrize("addr, host, port", [("127.0.0.1:8080", "127.0.0.1", 8080), ("[::1]:0", "::1", 0),
                                              (":9000", "0.0.0.0", 9000), ("localhost:1", "localhost", 1)])
def test_addresses(addr: str, host: str, port: int) -> None:
    assert parse_addr(addr) == (host, port)


def test_bad_addresses_and_loopback() -> None:
    for bad in ("8080", "host:", "host:99999", "host:http"):
        with pytest.raises(ConfigError):
            parse_addr(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")


def test_roles_include_the_ones_before() -> None:
    assert Role.OPERATOR.allows(Role.PRODUCER) and Role.PRODUCER.allows(Role.READER)
    assert not Role.READER.allows(Role.PRODUCER) and not Role.PRODUCER.allows(Role.OPERATOR)
    assert parse_role("reader") is Role.READER
    with pytest.raises(ValueError, match="unknown role"):
        parse_role("admin")


@pytest.mark.parametrize("text", ["", "{}", "[]", '{"id": 1}', '{"id": "a", "role": "root"}', "not json"])
def test_a_key_record_that_does_not_parse_is_left_out(text: str) -> None:
    assert KeyRecord.from_json(text) is None


def test_key_hashes_are_sha256() -> None:
    record: Any = KeyRecord.from_json('{"id": "ab", "name": "n", "role": "reader", "created_at": "t"}')
    assert record.role is Role.READER
    assert len(key_sha256("rk_x")) == 64


def test_the_api_options_are_the_library_options() -> None:
    defaults = SubmitOptions()
    for name, field in TaskOptions.model_fields.items():
        assert field.default == getattr(defaults, name), name
    assert TaskOptions().options() == defaults
    body = SubmitBody.model_validate({"capability": "c", "payload": 1, "priority": 7, "metadata": {"m": 1},
                                      "region": "eu", "region_strict": False})
    assert body.options("k") == SubmitOptions(priority=7, metadata={"m": 1}, region="eu",
                                              region_strict=False, idempotency_key="k")
