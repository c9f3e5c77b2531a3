"""The pure parts of capability descriptions and of the A2A and MCP bridges, without Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agent_worker.context import TaskContext
from agent_worker.describe import derived, from_config, parse_describe, registered
from broker.codec import whole_numbers
from broker.errors import ConfigError
from broker.models import CapabilityDescription, described_json, parse_described
from broker.models import TaskEvent as Event
from broker.ops.catalog import CapabilityRow
from broker.settings import CapabilityConfig

# -- descriptions ---------------------------------------------------------------------------


class Order(BaseModel):
    item: str
    quantity: int = 1


class Receipt(BaseModel):
    total: float


async def priced(ctx: TaskContext, payload: Order) -> Receipt:
    """Price an order.

    Totals include tax."""
    return Receipt(total=1.0)


def plain(ctx: TaskContext, payload: dict[str, int]) -> list[str]:
    return []


def test_a_description_is_derived_from_the_docstring_and_the_annotations() -> None:
    d = derived(priced)
    assert d.description == "Price an order.\n\nTotals include tax."
    assert d.input_schema is not None and d.input_schema["required"] == ["item"]
    assert d.output_schema is not None and d.output_schema["title"] == "Receipt"
    other = derived(plain)
    assert other.description is None
    assert other.input_schema == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert other.output_schema == {"type": "array", "items": {"type": "string"}}


def test_given_descriptions_override_field_by_field(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"sku": {"type": "string"}}}))
    config = from_config(CapabilityConfig(description="From the file", input_schema=str(schema),
                                          examples=[{"sku": "a"}]))
    merged = derived(priced).merged(config)
    assert merged.description == "From the file" and merged.input_schema == json.loads(schema.read_text())
    assert merged.output_schema is not None and merged.examples == [{"sku": "a"}]
    given = tmp_path / "given.json"
    given.write_text(json.dumps({"description": "Given", "output_schema": {"type": "object"}}))
    described = parse_describe(["price=Prices things", f"price=@{given}"], ["price", "other"])
    assert described["price"].description == "Given"
    assert described["price"].output_schema == {"type": "object"}
    assert parse_describe(["Only one"], ["solo"])["solo"].description == "Only one"


@pytest.mark.parametrize(("items", "capabilities", "message"), [
    (["no capability named"], ["a", "b"], "say which capability"),
    (["a=@/nonexistent/x.json"], ["a"], "cannot read --describe"),
    (["a=" + "x" * 5000], ["a"], "at most 4000 characters"),
])
def test_bad_describe_values_are_refused_clearly(items: list[str], capabilities: list[str],
                                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_describe(items, capabilities)


def test_descriptions_round_trip_through_the_registry_field_and_too_large_ones_are_refused() -> None:
    described = {"a": CapabilityDescription(description="A"), "b": CapabilityDescription()}
    text = described_json(described)
    assert json.loads(text) == {"a": {"description": "A"}}  # (an empty one is not registered)
    assert parse_described(text) == {"a": CapabilityDescription(description="A")}
    assert parse_described("not json") == {} and parse_described('{"x": {"examples": 3}}') == {}
    huge = CapabilityDescription(input_schema={"enum": ["x" * 100] * 1000})
    with pytest.raises(ConfigError, match="bytes of JSON"):
        registered({"big": huge})


def test_whole_numbers_undo_protobufs_doubles() -> None:
    big = 2.0**60
    assert whole_numbers({"a": [1.0, 2.5, {"b": 3.0}], "c": big}) == {"a": [1, 2.5, {"b": 3}], "c": big}


# -- A2A ------------------------------------------------------------------------------------

a2a = pytest.importorskip("a2a")

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

mcp = pytest.importorskip("mcp")

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
