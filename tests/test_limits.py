"""Limits on what crosses a trust boundary (broker/limits.py): JSON nesting depth and sizes of
payloads, metadata, results and progress, in the client and in real worker processes; and the
bounded number of progress events a task keeps."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from broker import ReachClient, TaskFailed, codec, limits
from broker.errors import InvalidPayload, NestedTooDeep, PayloadTooLarge
from broker.keys import CapabilityKeys
from broker.settings import Settings
from tests.conftest import Fleet
from tests.fuzz_settings import bounded

pytestmark = pytest.mark.one_redis

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6), inner, max_size=4),
    max_leaves=40,
)


def depth_of(value: Any) -> int:
    """The reference: nesting depth by walking the value."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


def nested(depth: int) -> Any:
    """Arrays and objects, `depth` levels in all."""
    value: Any = []
    for i in range(depth - 1):
        value = [value] if i % 2 else {"k": value}
    return value


# -- the checker -------------------------------------------------------------------------------

@bounded(200)
@given(value=JSON, indent=st.sampled_from([None, 2]), ascii_only=st.booleans())
def test_nesting_depth_is_the_values_depth(value: Any, indent: int | None, ascii_only: bool) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert limits.nesting_depth(text) == depth_of(value)
    assert limits.nesting_depth(text.encode()) == depth_of(value)
    for limit in (1, 2, 3, 64):
        assert limits.nests_deeper(text, limit) == (depth_of(value) > limit)


@bounded(200)
@given(text=st.text() | st.binary())
def test_nesting_depth_of_any_text_is_an_answer(text: str | bytes) -> None:
    assert limits.nesting_depth(text) >= 0  # (never an exception, whatever the text)


def test_brackets_inside_strings_are_no_nesting() -> None:
    text = codec.dumps({"a": "[[[[{{{{" * 100, "b": '\\"[[[['})
    assert limits.nesting_depth(text) == 1 and not limits.nests_deeper(text, 1)


def test_the_depth_limit_is_exact() -> None:
    assert codec.loads(codec.encode_payload(nested(64), 10_000)) == nested(64)
    with pytest.raises(NestedTooDeep, match="nests 65 levels deep, over the limit of 64"):
        codec.encode_payload(nested(65), 10_000)
    with pytest.raises(NestedTooDeep, match="over the limit of 3"):
        codec.encode_payload({"a": {"b": {"c": {}}}}, 10_000, max_depth=3)


def test_a_value_too_deep_to_encode_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(NestedTooDeep, match="nested too deeply to encode"):
        codec.encode_payload(nested(100_000), 10**9)


def test_parsing_text_too_deep_is_a_value_error() -> None:
    # (regression: a RecursionError escaped codec.loads, and readers of strangers' data, which
    # catch ValueError, died of it: a worker's inbox reader, on an entry's metadata)
    with pytest.raises(ValueError, match="nested too deeply"):
        codec.loads("[" * 100_000 + "]" * 100_000)


def test_a_lone_surrogate_is_an_invalid_payload() -> None:
    # (regression: UnicodeEncodeError escaped encode_payload, a crash instead of a refusal)
    with pytest.raises(InvalidPayload, match="lone surrogate"):
        codec.encode_payload({"text": "\ud800"}, 10_000)


def test_sizes_name_their_setting() -> None:
    with pytest.raises(PayloadTooLarge, match=r"result is 1\d\d bytes .* \(max_result_bytes\)"):
        codec.encode_payload("x" * 100, 50, "result", setting="max_result_bytes")
    assert codec.encode_payload("é" * 10, 22) == '"' + "é" * 10 + '"'  # (bytes of UTF-8, not characters)
    with pytest.raises(PayloadTooLarge):
        codec.encode_payload("é" * 10, 21)


def test_settings_defaults() -> None:
    s = Settings.load()
    assert (s.max_json_depth, s.max_result_bytes, s.max_metadata_bytes, s.max_progress_message_bytes,
            s.max_progress_events, s.gateway_rate_limit) == (64, 1048576, 65536, 65536, 100, 0.0)


# -- the client --------------------------------------------------------------------------------

def _nothing_written(r: redis.Redis, prefix: str) -> bool:
    return not [k for k in r.scan_iter(match=f"{prefix}:*") if not k.endswith(":capabilities")]


def test_submit_refuses_deep_payloads_and_large_metadata(make_settings: Any, r: redis.Redis,
                                                         prefix: str) -> None:
    with ReachClient(make_settings(max_json_depth=4, max_metadata_bytes=100)) as client:
        with pytest.raises(NestedTooDeep, match="payload nests 5 levels deep, over the limit of 4"):
            client.submit("cap", nested(5))
        with pytest.raises(NestedTooDeep, match="metadata nests"):
            client.submit("cap", {}, metadata={"a": {"b": {"c": {"d": {}}}}})
        with pytest.raises(PayloadTooLarge, match=r"metadata is \d+ bytes .*max_metadata_bytes"):
            client.submit("cap", {}, metadata={"m": "x" * 100})
        with pytest.raises(NestedTooDeep):
            client.submit_many("cap", [{}, nested(5)])
        assert _nothing_written(r, prefix)
        assert client.submit("cap", nested(4), metadata={"m": "x" * 50}).status().state == "queued"


# -- the worker --------------------------------------------------------------------------------

def test_a_result_over_the_limits_fails_as_bad_result_and_the_worker_goes_on(
        make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings(max_result_bytes=2000, max_json_depth=10)
    fleet.dispatcher(settings=settings)
    fleet.worker("big", handler="tests.limits_handlers:big_result", settings=settings)
    fleet.worker("deep", handler="tests.limits_handlers:deep_result", settings=settings)
    with ReachClient(settings) as client:
        with pytest.raises(TaskFailed) as large:
            client.submit("big", {"size": 5000}).result(timeout=30)
        assert large.value.reason == "bad_result"
        assert "over the limit of 2000 bytes (max_result_bytes)" in str(large.value.error)
        with pytest.raises(TaskFailed) as deep:
            client.submit("deep", {"depth": 11}).result(timeout=30)
        assert deep.value.reason == "bad_result"
        assert "nests 11 levels deep, over the limit of 10 (max_json_depth)" in str(deep.value.error)
        # (both workers are still there and serve what is within the limits)
        assert client.submit("big", {"size": 100}).result(timeout=30) == {"text": "x" * 100}
        assert len(json.dumps(client.submit("deep", {"depth": 10}).result(timeout=30))) == 20


def test_a_progress_message_over_the_limits_is_refused_to_the_handler(
        make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings(max_progress_message_bytes=1000, max_json_depth=8)
    fleet.dispatcher(settings=settings)
    fleet.worker("loud", handler="tests.limits_handlers:loud_progress", settings=settings)
    with ReachClient(settings) as client:
        refused = client.submit("loud", {"size": 2000, "depth": 9}).result(timeout=30)
        assert "over the limit of 1000 bytes (max_progress_message_bytes)" in refused["size"]
        assert "progress nests 9 levels deep, over the limit of 8" in refused["depth"]
        handle = client.submit("loud", {"size": 900, "depth": 7})
        assert handle.result(timeout=30) == {"size": None, "depth": None}
        assert [e.data.get("message", "")[:1] for e in handle.events() if e.type == "progress"] == ["m", "n"]


def test_a_task_keeps_its_latest_progress_events(make_settings: Any, fleet: Fleet, r: redis.Redis,
                                                prefix: str) -> None:
    settings = make_settings(max_progress_events=20)
    fleet.dispatcher(settings=settings)
    fleet.worker("chatty", handler="tests.limits_handlers:chatty", settings=settings)
    with ReachClient(settings) as client:
        handle = client.submit("chatty", {"n": 1500})
        assert handle.result(timeout=60) == {"steps": 1500}
        status = handle.status()
        assert status.progress_dropped == 1480 and status.cli_dict()["progress_dropped"] == 1480
        # The record holds 20 progress events; followers skip the gap of the dropped ones (more
        # than the 1000 seqs a read looks at) and still reach the end.
        events = list(handle.events(timeout=30))
        steps = [e.data["step"] for e in events if e.type == "progress"]
        assert steps == list(range(1480, 1500))
        assert [e.type for e in events][-1] == "succeeded"
        assert events[0].type == "queued"
        local = handle.task_id.split(":")[1]
        fields = r.hkeys(CapabilityKeys(prefix, "chatty").task(local))
        assert sum(1 for f in fields if f.startswith("e:")) < 30
        assert client.submit("chatty", {"n": 3}).status().progress_dropped == 0


async def _async_events(settings: Settings, task_id: str) -> list[str]:
    from broker import AsyncReachClient

    async with AsyncReachClient(settings) as client:
        return [e.type async for e in client.events(task_id, timeout=30)]


def test_the_async_client_follows_a_task_past_dropped_progress(make_settings: Any, fleet: Fleet) -> None:
    import asyncio

    settings = make_settings(max_progress_events=5)
    fleet.dispatcher(settings=settings)
    fleet.worker("chatty", handler="tests.limits_handlers:chatty", settings=settings)
    with ReachClient(settings) as client:
        handle = client.submit("chatty", {"n": 1200})
        handle.result(timeout=60)
    types = asyncio.run(_async_events(settings, handle.task_id))
    assert types.count("progress") == 5 and types[-1] == "succeeded"
