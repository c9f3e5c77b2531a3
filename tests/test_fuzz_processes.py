"""Malformed data fed to real processes through a real Redis and real HTTP: raw intake entries
to a dispatcher, inbox entries to a worker, request bodies to a gateway. Each process must keep
running, dead-letter what it cannot read with reason `malformed` (or refuse it: a 4xx with a
JSON error), and go on serving what is valid. Hypothesis draws the data (a bounded number of
examples: tests/fuzz_settings.py); the pure parsers are fuzzed in tests/test_fuzz_parsers.py.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from broker import ReachClient, codec
from broker.keys import CapabilityKeys, Channels, RegistryKeys
from broker.settings import Settings
from dlq_tools import transfer
from dlq_tools.conn import Conn
from dlq_tools.models import Filter
from tests.conftest import FAST, Fleet, _delete_prefix, sync_redis, wait_until
from tests.fuzz_settings import bounded
from tests.gateway_helpers import start_gateway
from tests.test_fuzz_parsers import INBOX_FIELDS, INTAKE_FIELDS, JSONISH

pytestmark = pytest.mark.one_redis

RAW = st.binary(max_size=30)
# Raw intake entries as bytes: the known fields with JSON-ish or random values, random fields.
RAW_INTAKE = st.one_of(
    INTAKE_FIELDS.map(lambda f: {k.encode("utf-8", "surrogatepass"): v.encode("utf-8", "surrogatepass")
                                 for k, v in f.items()}),
    st.dictionaries(st.sampled_from([b"payload", b"metadata", b"priority"]) | RAW,
                    RAW | JSONISH.map(lambda t: t.encode("utf-8", "surrogatepass")), max_size=4),
).filter(bool)


@pytest.fixture(scope="module")
def spine(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Fleet]]:
    """A dispatcher for `fuzz` and a worker for `fuzzin`, shared by every example."""
    prefix = f"t{secrets.token_hex(4)}"
    settings = Settings.load(redis_url=redis_url, prefix=prefix, max_json_depth=16, **FAST)
    fleet = Fleet(settings, tmp_path_factory.mktemp("fuzz"))
    try:
        client = sync_redis(redis_url)
        client.sadd(RegistryKeys(prefix).capabilities, "fuzz", "fuzzin")  # (as a raw producer would)
        client.close()
        fleet.dispatcher("fuzz", "fuzzin")
        fleet.worker("fuzzin", handler="tests.limits_handlers:echo", agent_id="fuzz-agent")
        yield settings, fleet
        for proc in fleet.procs:
            assert proc.popen.poll() is None, f"{proc.name} exited:\n{proc.output()[-3000:]}"
            assert "Traceback" not in proc.output(), proc.output()[-3000:]
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)


def _dead_letters(r: Any, ck: CapabilityKeys) -> dict[str, str]:
    """source (stream and entry id) -> reason, of the capability's raw dead letters."""
    return {fields["source"]: fields["reason"] for _, fields in r.xrange(ck.dlq) if fields.get("source")}


@bounded(12)
@given(entries=st.lists(RAW_INTAKE, min_size=1, max_size=6))
def test_a_dispatcher_dead_letters_malformed_intake_entries(spine: tuple[Settings, Fleet],
                                                            entries: list[dict[bytes, bytes]]) -> None:
    settings, fleet = spine
    ck = CapabilityKeys(settings.prefix, "fuzz")
    raw = redis.Redis.from_url(settings.redis_url)
    r = sync_redis(settings.redis_url, encoding_errors="surrogateescape")
    try:
        tasks_before = r.zcard(ck.tasks)
        ids = [raw.xadd(ck.intake, entry).decode() for entry in entries]
        r.publish(Channels(settings.prefix).wake, "task fuzz")
        wait_until(lambda: r.xlen(ck.intake) == 0, 30, message="the intake entries taken")
        dead = _dead_letters(r, ck)
        malformed = [i for i in ids if f"{ck.intake} {i}" in dead]
        assert all(dead[f"{ck.intake} {i}"] == "malformed" for i in malformed)
        # Every entry is a task or a dead letter, never lost, never both (entries that repeat an
        # idempotency key make one task between them).
        made = r.zcard(ck.tasks) - tasks_before
        if any(b"idempotency_key" in entry for entry in entries):
            assert made <= len(ids) - len(malformed)
        else:
            assert made == len(ids) - len(malformed)
        assert all(proc.popen.poll() is None for proc in fleet.procs)
    finally:
        raw.close()
        r.close()


def test_the_dispatcher_still_takes_valid_entries_after_malformed_ones(spine: tuple[Settings, Fleet]) -> None:
    settings, _ = spine
    ck = CapabilityKeys(settings.prefix, "fuzz")
    r = sync_redis(settings.redis_url, encoding_errors="surrogateescape")
    try:
        bad = [r.xadd(ck.intake, fields) for fields in (
            {"payload": "[" * 100_000},  # (deeper than the parser goes: was a RecursionError)
            {"payload": "[" * 17 + "]" * 17},  # (deeper than max_json_depth)
            {"payload": "{}", "metadata": '{"a":' * 20 + "1" + "}" * 20},
            {"payload": "1", "priority": "9" * 5000})]
        good = r.xadd(ck.intake, {"payload": '{"ok": true}', "priority": "3"})
        r.publish(Channels(settings.prefix).wake, "task fuzz")
        wait_until(lambda: r.xlen(ck.intake) == 0, 30, message="the intake entries taken")
        dead = _dead_letters(r, ck)
        assert [dead.get(f"{ck.intake} {i}") for i in bad] == ["malformed"] * 4
        assert f"{ck.intake} {good}" not in dead
    finally:
        r.close()


def test_dlq_export_and_import_keep_bytes_that_are_not_utf8(spine: tuple[Settings, Fleet],
                                                           tmp_path: Path) -> None:
    # (regression: the export died of a UnicodeEncodeError on the raw fields of such an entry)
    settings, _ = spine
    ck = CapabilityKeys(settings.prefix, "fuzz")
    raw = redis.Redis.from_url(settings.redis_url)
    try:
        entry = raw.xadd(ck.intake, {b"payload": b'"\xff\xfe"', b"\xc3": b"\xff"}).decode()
        raw.publish(Channels(settings.prefix).wake, "task fuzz")
        source = f"{ck.intake} {entry}".encode()
        wait_until(lambda: any(f.get(b"source") == source for _, f in raw.xrange(ck.dlq)), 30,
                   message="the entry dead-lettered")
        path = tmp_path / "dlq.jsonl"
        other = settings.model_copy(update={"prefix": settings.prefix + "x"})
        with contextlib.closing(Conn(settings)) as conn:
            assert transfer.export(conn, ["fuzz"], Filter(), path) >= 1
        try:
            with contextlib.closing(Conn(other)) as conn:
                assert transfer.import_file(conn, path).imported >= 1
            copied = [f for _, f in raw.xrange(CapabilityKeys(other.prefix, "fuzz").dlq)
                      if f.get(b"source") == source]
            assert len(copied) == 1
            original = next(f for _, f in raw.xrange(ck.dlq) if f.get(b"source") == source)
            assert copied[0][b"raw"] == original[b"raw"] and b"\xff" in original[b"raw"]
        finally:
            _delete_prefix(settings.redis_url, other.prefix)
    finally:
        raw.close()


@bounded(12)
@given(entries=st.lists(INBOX_FIELDS.filter(bool), min_size=1, max_size=6))
def test_a_worker_dead_letters_malformed_inbox_entries(spine: tuple[Settings, Fleet],
                                                       entries: list[dict[str, str]]) -> None:
    settings, fleet = spine
    ck = CapabilityKeys(settings.prefix, "fuzzin")
    inbox = ck.inbox("fuzz-agent")
    r = sync_redis(settings.redis_url, encoding_errors="surrogateescape")
    try:
        ids = [r.xadd(inbox, {k.encode("utf-8", "surrogatepass"): v.encode("utf-8", "surrogatepass")
                              for k, v in entry.items()}) for entry in entries]
        # (read, then dead-lettered or refused by accept.lua: never left unread, never a crash)
        wait_until(lambda: not set(ids) & {i for i, _ in r.xrange(inbox)}, 30,
                   message="the inbox entries handled")
        dead = _dead_letters(r, ck)
        assert {dead[f"{inbox} {i}"] for i in ids if f"{inbox} {i}" in dead} <= {"malformed"}
        assert all(proc.popen.poll() is None for proc in fleet.procs)
    finally:
        r.close()


def test_the_worker_still_serves_after_malformed_inbox_entries(spine: tuple[Settings, Fleet]) -> None:
    settings, _ = spine
    inbox = CapabilityKeys(settings.prefix, "fuzzin").inbox("fuzz-agent")
    r = sync_redis(settings.redis_url, encoding_errors="surrogateescape")
    try:
        # A forged entry whose metadata is nested deeper than the parser goes (regression: the
        # RecursionError ended the worker's inbox reader).
        r.xadd(inbox, {"id": "01JB0000000000000000000000", "fence": "1", "p": "{}",
                       "x": "1|1000|0|3|t||" + "[" * 100_000})
        r.xadd(inbox, {"junk": "x"})
        with ReachClient(settings) as client:
            assert client.submit("fuzzin", {"n": 1}).result(timeout=30) == {"n": 1}
    finally:
        r.close()


WAKE_TEXT = st.one_of(
    st.builds(" ".join, st.lists(st.sampled_from(["task", "free", "took", "agent", "policy", "fuzz",
                                                  "fuzz-agent", "1", "-1", "nan", "1e400", "*", ""])
                                 | st.text(max_size=8), max_size=10)),
    st.binary(max_size=40),
)


@bounded(10)
@given(messages=st.lists(WAKE_TEXT, min_size=1, max_size=20),
       grants=st.lists(st.text(max_size=30) | st.builds("|".join, st.lists(st.text(max_size=6), max_size=6)),
                       max_size=5))
def test_wake_messages_and_grants_do_not_stop_the_spine(spine: tuple[Settings, Fleet], messages: list[Any],
                                                        grants: list[str]) -> None:
    # Forged wake-ups on the dispatchers' channel, and forged grants where submit looks for a
    # hand-off: the dispatcher drops what does not parse, submit skips what does not match.
    settings, fleet = spine
    ck = CapabilityKeys(settings.prefix, "fuzzin")
    r = sync_redis(settings.redis_url, encoding_errors="surrogateescape")
    try:
        for message in messages:
            r.publish(Channels(settings.prefix).wake, message)
        if grants:
            r.lpush(ck.grants, *grants)
        with ReachClient(settings) as client:
            assert client.submit("fuzzin", {"ok": 1}).result(timeout=30) == {"ok": 1}
        assert all(proc.popen.poll() is None for proc in fleet.procs)
    finally:
        r.close()


# -- the gateway --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway(spine: tuple[Settings, Fleet]) -> Iterator[httpx.Client]:
    _settings, fleet = spine
    _, url = start_gateway(fleet)
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client


def _assert_refusal_or_taken(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:300]
    if response.status_code >= 400:
        error = codec.loads(response.content)["error"]
        assert isinstance(error["code"], str) and error["message"]


BODY_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=15)
SUBMIT_BODIES = st.one_of(
    st.fixed_dictionaries({"capability": st.sampled_from(["fuzz", "Bad", ""]), "payload": BODY_VALUES},
                          optional={"priority": BODY_VALUES, "metadata": BODY_VALUES,
                                    "timeout_s": BODY_VALUES, "payloads": BODY_VALUES})
    .map(lambda d: codec.dumps(d).encode()),
    JSONISH.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(0, 2000).map(lambda n: b'{"capability": "fuzz", "payload": ' + b"[" * n + b"]" * n + b"}"),
    st.binary(max_size=80),
)


@bounded(60)
@given(path=st.sampled_from(["/v1/tasks", "/v1/tasks/batch",
                             "/v1/callbacks/fuzz:01JB0000000000000000000000"]),
       body=SUBMIT_BODIES, content_type=st.sampled_from(["application/json", None, "text/plain"]))
def test_the_gateway_refuses_malformed_bodies(gateway: httpx.Client, path: str, body: bytes,
                                              content_type: str | None) -> None:
    headers = {"X-Reach-Callback-Token": "1.x"} if "callbacks" in path else {}
    if content_type:
        headers["Content-Type"] = content_type
    _assert_refusal_or_taken(gateway.post(path, content=body, headers=headers))


def test_the_gateway_limits_depth_and_size(gateway: httpx.Client) -> None:
    def submit(payload_text: str) -> httpx.Response:
        body = b'{"capability": "fuzz", "payload": ' + payload_text.encode() + b"}"
        return gateway.post("/v1/tasks", content=body)

    deep = submit("[" * 17 + "]" * 17)  # (max_json_depth is 16 here)
    assert deep.status_code == 422 and deep.json()["error"]["code"] == "nested_too_deep"
    assert "over the limit of 16" in deep.json()["error"]["message"]
    very_deep = submit("[" * 200_000 + "]" * 200_000)  # (refused before it is parsed)
    assert very_deep.status_code == 422 and very_deep.json()["error"]["code"] == "nested_too_deep"
    assert submit("[" * 16 + "]" * 16).status_code == 202
    large = submit('"' + "x" * (1024 * 1024) + '"')
    assert large.status_code == 413 and "max_payload_bytes" in large.json()["error"]["message"]
    meta = gateway.post("/v1/tasks", json={"capability": "fuzz", "payload": {},
                                          "metadata": {"m": "x" * 70_000}})
    assert meta.status_code == 413 and "max_metadata_bytes" in meta.json()["error"]["message"]
    batch = gateway.post("/v1/tasks/batch", content=b'{"capability": "fuzz", "payloads": [' + b"[" * 17
                         + b"]" * 17 + b"]}")
    assert batch.status_code == 422 and batch.json()["error"]["code"] == "nested_too_deep"


@pytest.mark.parametrize(("method", "path", "headers"), [
    ("GET", "/v1/tasks/fuzzin:01JB0000000000000000000000/events", {"Last-Event-ID": "\u00b2"}),
    ("GET", "/console", {"Cookie": "reach_console=k.n.\u00b2.m"}),
    ("POST", "/v1/callbacks/fuzzin:01JB0000000000000000000000",
     {"X-Reach-Callback-Token": "\u00b2." + "s" * 20, "Content-Type": "application/json"}),
])
def test_digits_that_are_not_ascii_are_refused_not_a_server_error(
        gateway: httpx.Client, method: str, path: str, headers: dict[str, str]) -> None:
    # (regression: '\u00b2'.isdigit() is true and int('\u00b2') fails: each answered 500)
    encoded = {k: v.encode("latin-1") for k, v in headers.items()}
    response = gateway.request(method, path, headers=encoded, content=b'{"status": "success"}'
                               if method == "POST" else None)
    assert 400 <= response.status_code < 500 or response.status_code in (200, 303, 307), response.text[:300]
