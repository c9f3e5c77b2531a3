"""Every bad input gets a clear, specific error and enqueues nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis

from agent_worker.registration import register
from broker import (
    BadInput,
    BrokerUnavailable,
    InvalidCapability,
    InvalidPayload,
    InvalidPriority,
    InvalidTaskId,
    ReachClient,
    Settings,
    UnknownTask,
)
from broker.infra import connection
from broker.keys import CapabilityKeys, Channels, RegistryKeys
from broker.models import AgentDescriptor
from broker.scripts import AsyncScripts
from tests.conftest import Fleet, wait_until


def _nothing_written(r: redis.Redis, prefix: str) -> bool:
    return not [k for k in r.scan_iter(match=f"{prefix}:*") if not k.endswith(":capabilities")]


@pytest.mark.parametrize("name", ["", "Summarize", "-x", "a" * 65, "has space", "a:b", "a{b}",
                                  "summarize\n", 7, None])
def test_invalid_capability_names(client: ReachClient, r: redis.Redis, prefix: str, name: Any) -> None:
    with pytest.raises(InvalidCapability, match="invalid capability name"):
        client.submit(name, {"x": 1})
    assert _nothing_written(r, prefix)


@pytest.mark.parametrize("payload, fragment", [
    (float("nan"), "JSON cannot represent"),
    ({"a": float("inf")}, "JSON cannot represent"),
    (b"bytes", "bytes, which is not a JSON value"),
    ({1, 2}, "set, which is not a JSON value"),
    ({1: "a"}, "non-string key 1"),
    ({"a": [object()]}, "object, which is not a JSON value"),
    ({"nested": {"deep": {(1, 2): 3}}}, "non-string key"),
])
def test_payloads_that_are_not_strict_json(client: ReachClient, r: redis.Redis, prefix: str,
                                           payload: Any, fragment: str) -> None:
    with pytest.raises(InvalidPayload, match=fragment):
        client.submit("cap", payload)
    assert _nothing_written(r, prefix)


def test_every_json_value_is_a_valid_payload(client: ReachClient) -> None:
    for payload in [{"a": 1}, [1, "2"], "text", 3, 2.5, True, None, {"unicode": "日本語 ✓"}]:
        handle = client.submit("cap", payload)
        assert handle.status().state == "queued"


def test_payload_over_the_size_limit(make_settings: Any, r: redis.Redis, prefix: str) -> None:
    with ReachClient(make_settings(max_payload_bytes=1000)) as client:
        with pytest.raises(InvalidPayload, match=r"over the limit of 1000 bytes"):
            client.submit("cap", {"text": "x" * 1000})
        client.submit("cap", {"text": "x" * 900})
    with ReachClient(make_settings()) as client, pytest.raises(InvalidPayload, match="1048576"):
        client.submit("cap", {"text": "x" * (1024 * 1024)})


@pytest.mark.parametrize("priority", [-1, 10, 5.0, "5", True, None])
def test_priority_out_of_range(client: ReachClient, r: redis.Redis, prefix: str, priority: Any) -> None:
    with pytest.raises(InvalidPriority, match="priority must be an int from 0 to 9"):
        client.submit("cap", {}, priority=priority)
    assert _nothing_written(r, prefix)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"deadline_s": -1}, "deadline_s must be a positive number"),
    ({"session_id": ""}, "session_id must be a non-empty string"),
    ({"idempotency_key": "k" * 300}, "idempotency_key must be a non-empty string"),
    ({"metadata": [1]}, "metadata must be a JSON object"),
    ({"metadata": {"a": float("nan")}}, "metadata"),
    ({"max_attempts": 0}, "max_attempts must be an int from 1 to 100"),
])
def test_other_bad_options(client: ReachClient, r: redis.Redis, prefix: str, kwargs: dict[str, Any],
                           fragment: str) -> None:
    with pytest.raises(BadInput, match=fragment):
        client.submit("cap", {}, **kwargs)
    assert _nothing_written(r, prefix)


def test_submit_many_validates_everything_before_writing(client: ReachClient, r: redis.Redis,
                                                         prefix: str) -> None:
    with pytest.raises(InvalidPayload):
        client.submit_many("cap", [{"ok": 1}, {"ok": 2}, {"bad": {1, 2}}])
    assert _nothing_written(r, prefix)


@pytest.mark.parametrize("task_id", ["", "nocolon", "cap:short", "Cap:01KZZZZZZZZZZZZZZZZZZZZZZZ",
                                     "a:b:c", 42])
def test_malformed_task_ids(client: ReachClient, task_id: Any) -> None:
    for call in (client.status, client.result, client.cancel, client.get):
        with pytest.raises(InvalidTaskId, match="invalid task id"):
            call(task_id)


def test_unknown_task_ids(client: ReachClient) -> None:
    unknown = "cap:01KZZZZZZZZZZZZZZZZZZZZZZZ"
    for call in (client.status, client.cancel, client.get):
        with pytest.raises(UnknownTask, match="unknown task id"):
            call(unknown)
    with pytest.raises(UnknownTask):
        client.result(unknown, timeout=1)
    with pytest.raises(UnknownTask):
        list(client.events(unknown, timeout=1))


def test_queue_full_raises_with_depth_and_limit(make_settings: Any) -> None:
    from broker import QueueFull

    with ReachClient(make_settings(max_queue_depth=5)) as client:
        client.submit_many("full", [{}] * 5)
        with pytest.raises(QueueFull) as exc:
            client.submit("full", {})
        assert exc.value.depth == 5 and exc.value.limit == 5
        assert "depth 5 reached the limit 5" in str(exc.value)
        assert client.queue_depth("full") == 5


def test_redis_away_raises_broker_unavailable() -> None:
    from broker.infra.embedded import free_port

    settings = Settings.load(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    client = ReachClient(settings)
    with pytest.raises(BrokerUnavailable, match="unavailable"):
        client.submit("cap", {})
    with pytest.raises(BrokerUnavailable):
        client.status("cap:01KZZZZZZZZZZZZZZZZZZZZZZZ")


def test_redis_password_is_never_in_the_error() -> None:
    from broker.infra.embedded import free_port

    settings = Settings.load(redis_url=f"redis://user:s3cret-pw@127.0.0.1:{free_port()}/0")
    with pytest.raises(BrokerUnavailable) as exc:
        ReachClient(settings).submit("cap", {})
    assert "s3cret-pw" not in str(exc.value) and "***" in str(exc.value)


def test_malformed_intake_entries_are_dead_lettered_not_crashing(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    ck = CapabilityKeys(prefix, "raw")
    r.xadd(ck.intake, {"payload": "{not json"})
    r.xadd(ck.intake, {"nopayload": "1"})
    r.xadd(ck.intake, {"payload": "{}", "priority": "eleven"})
    r.xadd(ck.intake, {"payload": "NaN"})
    r.xadd(ck.intake, {"payload": "[" * 5000 + "]" * 5000})  # (read with the good ones)
    raw = redis.Redis.from_url(client.settings.redis_url)
    raw.xadd(ck.intake, {b"payload": b'"\xff\xfe"'})
    r.xadd(ck.intake, {"payload": json.dumps({"n": 7}), "priority": "8",
                         "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    r.sadd(f"{prefix}:{{_registry}}:capabilities", "raw")
    dispatcher = fleet.dispatcher()
    fleet.worker("raw", handler="tests.handlers:record")
    wait_until(lambda: r.xlen(ck.dlq) == 6, message="6 dead letters")
    reader = redis.Redis.from_url(client.settings.redis_url, decode_responses=True,
                                  encoding_errors="replace")
    entries = reader.xrange(ck.dlq)
    assert {e[1]["reason"] for e in entries} == {"malformed"}
    errors = " | ".join(e[1]["error"] for e in entries)
    assert "payload is not strict JSON" in errors and "no payload field" in errors
    assert "priority must be a number" in errors and "not UTF-8" in errors
    assert "payload is nested too deeply to parse" in errors
    assert json.loads(entries[0][1]["raw"]) == {"payload": "{not json"}
    wait_until(lambda: r.xlen(ck.intake) == 0, message="intake drained")
    assert dispatcher.popen.poll() is None, "the dispatcher must survive malformed entries"
    # The one valid entry became a real task and ran.
    done = wait_until(lambda: r.hgetall(f"{prefix}:test:runs"), message="valid entry ran")
    assert done == {"7": "1"}


@pytest.mark.one_redis
def test_forged_agent_records_and_wake_ups_do_not_stop_the_dispatcher(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # Agents registered with heartbeat stats of the wrong kind, and nested too deeply to parse;
    # then a completion wake-up whose execution time is NaN. (Each once stopped the dispatcher
    # from starting or every round of the capability.)
    settings = client.settings

    async def forge() -> None:
        aclient = connection.async_client(settings)
        scripts = AsyncScripts(aclient)
        for agent_id in ("forged-types", "forged-deep"):
            await register(settings, aclient, scripts,
                           AgentDescriptor(agent_id=agent_id, capabilities=["reg"], max_concurrency=4))
        await aclient.aclose()

    asyncio.run(forge())
    registry = RegistryKeys(prefix)
    r.hset(registry.agent("forged-types"), "stats", '{"inflight": "2", "loop_progress_age_ms": 999999}')
    r.hset(registry.agent("forged-deep"), "stats", '{"x":' + "[" * 5000 + "]" * 5000 + "}")
    dispatcher = fleet.dispatcher()
    good = fleet.worker("reg", handler="tests.handlers:record")
    r.publish(Channels(prefix).wake, f"free reg {good.agent_id} 0 0 0 1 nan 0")
    handles = [client.submit("reg", {"n": i}) for i in range(6)]
    assert [h.result(timeout=30) for h in handles] == [{"n": i} for i in range(6)]
    assert {client.status(h.task_id).agent_id for h in handles} == {good.agent_id}
    assert dispatcher.popen.poll() is None


def test_malformed_inbox_entry_does_not_crash_the_worker(
    client: ReachClient, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    fleet.dispatcher()
    worker = fleet.worker("inb", handler="tests.handlers:record")
    ck = CapabilityKeys(prefix, "inb")
    r.xadd(ck.inbox(worker.agent_id or ""), {"garbage": "yes"})
    wait_until(lambda: r.xlen(ck.dlq) == 1, message="dead letter")
    assert r.xrange(ck.dlq)[0][1]["reason"] == "malformed"
    assert client.run("inb", {"n": 1}, timeout=30) == {"n": 1}
    assert worker.popen.poll() is None


def test_config_errors_are_specific(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import ConfigError

    with pytest.raises(ConfigError, match="invalid setting lease_ms"):
        Settings.load(lease_ms=0)
    with pytest.raises(ConfigError, match="prefix"):
        Settings.load(prefix="a{b}")
    bad = tmp_path / "reach.toml"
    bad.write_text("lease_ms = 'soon'\n")
    with pytest.raises(ConfigError, match="lease_ms"):
        Settings.load(bad)
    bad.write_text("not toml [")
    with pytest.raises(ConfigError, match="cannot read config file"):
        Settings.load(bad)
    bad.write_text("leese_ms = 5\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.load(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        Settings.load(tmp_path / "missing.toml")
