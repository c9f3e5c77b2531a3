"""The pure parts of the A2A and MCP bridges, without Redis."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from broker.models import CapabilityDescription
from broker.models import TaskEvent as Event
from broker.ops.catalog import CapabilityRow

# -- A2A ------------------------------------------------------------------------------------

a2a = pytest.importorskip("a2a", reason="the a2a extra is not installed")

from a2a.types import Message, Part, Role, TaskState  # noqa: E402
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError  # noqa: E402

from agent_worker.a2a.cards import capability_name  # noqa: E402
from agent_worker.a2a.messages import parts_result, payload_part  # noqa: E402
from gateway.a2a import mapping  # noqa: E402
from gateway.a2a.index import BadCursor, Entry, decode_cursor, encode_cursor  # noqa: E402


def event(seq: int, kind: str, **data: Any) -> Event:
    return Event(seq=seq, type=kind, task_id="cap:01", attempt=1, agent_id="w1",
                 time=datetime(2026, 1, 1, tzinfo=UTC), data=data)


def test_a_tasks_events_fold_into_a2a_states_once_each() -> None:
    events = [event(1, "queued"), event(2, "dispatched"), event(3, "accepted"),
              event(4, "progress", fraction=0.5, message="half"), event(5, "expired", reason="expired"),
              event(6, "failed", reason="expired"), event(7, "dead_lettered", reason="expired")]
    shown, status = [], mapping.Status()
    for e in events:
        new = mapping.event_status(e, status)
        if new is not None:
            shown.append((e.seq, new.state))
            status = new
    assert shown == [(3, TaskState.TASK_STATE_WORKING), (4, TaskState.TASK_STATE_WORKING),
                     (5, TaskState.TASK_STATE_FAILED)]
    assert mapping.fold(events, upto=4).text == "half"
    failed = event(3, "failed", reason="invalid_request", error="bad")
    rejected = mapping.event_status(failed, mapping.Status())
    assert rejected is not None and rejected.state == TaskState.TASK_STATE_REJECTED
    assert rejected.text == "invalid_request: bad"


def test_a_messages_payload_is_its_data_part_else_its_text() -> None:
    data = payload_part({"n": 3})
    assert mapping.payload_of(Message(parts=[Part(text="note"), data])) == ({"n": 3}, False)
    assert mapping.payload_of(Message(parts=[Part(text="a"), Part(text="b")])) == ({"text": "a\nb"}, True)
    with pytest.raises(InvalidParamsError):
        mapping.payload_of(Message())
    with pytest.raises(InvalidParamsError, match="several data parts"):
        mapping.payload_of(Message(parts=[data, data]))
    with pytest.raises(ContentTypeNotSupportedError):
        mapping.payload_of(Message(parts=[Part(raw=b"\x00")]))


def test_the_bridge_sends_text_as_text_and_reads_parts_back() -> None:
    assert payload_part("hi").text == "hi" and payload_part({"text": "hi"}).text == "hi"
    assert payload_part({"text": "hi", "lang": "en"}).WhichOneof("content") == "data"
    assert parts_result([payload_part({"n": 1})]) == {"n": 1}
    assert parts_result([Part(text="a"), Part(text="b")]) == {"text": "ab"}
    assert parts_result([]) is None
    assert parts_result([Part(text="a"), payload_part(1)]) == {"parts": [{"text": "a"}, {"data": 1}]}
    assert capability_name("Translate Text") == "translate-text" and capability_name("ok.1") == "ok.1"
    assert Role.ROLE_USER  # (the enum the messages use)


def test_list_cursors_are_only_those_the_gateway_made() -> None:
    entry = Entry("cap:01JB0000000000000000000000", 1700000000000)
    assert decode_cursor(encode_cursor(entry)) == entry
    with pytest.raises(BadCursor):
        decode_cursor("bm9wZQ==")


# -- MCP ------------------------------------------------------------------------------------

mcp = pytest.importorskip("mcp", reason="the mcp extra is not installed")

from gateway.mcp import tools  # noqa: E402
from gateway.mcp.progress import ProgressReport  # noqa: E402


def row(**described: Any) -> CapabilityRow:
    return CapabilityRow("cap", 1, 1, 1, CapabilityDescription(**described))


def test_tools_take_object_payloads_as_they_are_and_wrap_the_others() -> None:
    assert tools.input_schema(row()) == ({"type": "object", "additionalProperties": True}, False)
    wrapped, is_wrapped = tools.input_schema(row(input_schema={"type": "string"}))
    assert is_wrapped and wrapped["required"] == ["payload"]
    assert tools.payload_of(row(input_schema={"type": "string"}), {"payload": "x"}) == "x"
    assert tools.payload_of(row(), {"a": 1}) == {"a": 1}
    result = tools.success(row(output_schema={"type": "integer"}), 3)
    assert result.structured_content == {"result": 3} and result.content[0].text == "3"  # type: ignore[union-attr]
    assert tools.success(row(), [1]).structured_content is None


def test_progress_values_only_grow() -> None:
    report = ProgressReport(session=None)  # type: ignore[arg-type]
    values = []
    for fraction in (0.2, None, 0.1, 0.5, 1.0, None):
        report.last = report.next_value(fraction)
        values.append(report.last)
    assert values == sorted(values) and len(set(values)) == len(values) - 1  # (only 1.0 repeats, capped)
    assert values[0] == 0.2 and values[3] == 0.5


async def test_without_an_extra_its_endpoints_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from broker.settings import Settings
    from gateway import protocols
    from gateway.app import create_app

    monkeypatch.setattr(protocols, "installed", lambda module: False)
    app = create_app(Settings.load(redis_url="redis://127.0.0.1:1/0"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        for path in ("/.well-known/agent-card.json", "/a2a/agents/x", "/mcp"):
            reply = await http.post(path) if path != "/.well-known/agent-card.json" else await http.get(path)
            assert reply.status_code == 501
            assert "pip install 'agent-reach[" in reply.json()["error"]["message"]
