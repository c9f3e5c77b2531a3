"""Capability descriptions: derived from handlers, given by the config file and --describe,
registered as JSON (pure parts, no Redis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from agent_worker.context import TaskContext
from agent_worker.describe import derived, from_config, parse_describe, registered
from broker.codec import whole_numbers
from broker.errors import ConfigError
from broker.models import CapabilityDescription, described_json, parse_described
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
