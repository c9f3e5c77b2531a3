"""Requests drawn from an OpenAPI document with hypothesis: valid ones (from each operation's
schemas) and invalid ones (wrong types, unknown fields, junk bodies, odd paths and headers).

Covers the JSON Schema the gateway's document uses: $ref, anyOf/oneOf/allOf, enum/const,
strings (pattern, lengths, date-time), integers and numbers (bounds), booleans, null, arrays,
objects (properties, required, additionalProperties) and untyped values (any JSON).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from datetime import UTC, timedelta, timezone
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

Schema = dict[str, Any]
MAX_TEXT = 40
MAX_ITEMS = 5

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=MAX_TEXT)
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)


@dataclass
class Operation:
    method: str
    path: str
    spec: Schema
    components: Schema = field(repr=False)

    @property
    def id(self) -> str:
        return f"{self.method.upper()} {self.path}"

    def parameters(self, where: str) -> list[Schema]:
        return [p for p in self.spec.get("parameters", []) if p["in"] == where]

    def body_schema(self) -> Schema | None:
        content = self.spec.get("requestBody", {}).get("content", {})
        return content.get("application/json", {}).get("schema")


def operations(document: Schema) -> list[Operation]:
    return [Operation(method, path, spec, document.get("components", {}))
            for path, methods in document["paths"].items() for method, spec in methods.items()]


def _resolve(schema: Schema, components: Schema) -> Schema:
    while "$ref" in schema:
        schema = components["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def from_schema(schema: Schema, components: Schema) -> st.SearchStrategy[Any]:
    """Values valid for `schema`."""
    schema = _resolve(schema, components)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, components) for s in schema[key]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], components)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, kind)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), components)
        return st.lists(items, min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
    if kind == "object":
        return _object(schema, components)
    return ANY_JSON


def _string(schema: Schema) -> st.SearchStrategy[Any]:
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    if schema.get("format") == "date-time":
        zones = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5))])
        return st.datetimes(timezones=zones).map(lambda d: d.isoformat())
    low = schema.get("minLength", 0)
    return st.text(min_size=low, max_size=max(low, min(schema.get("maxLength", MAX_TEXT), MAX_TEXT)))


def _number(schema: Schema, kind: str) -> st.SearchStrategy[Any]:
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + (1 if kind == "integer" else 1e-6)
    if "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - (1 if kind == "integer" else 1e-6)
    ints = st.integers(None if low is None else int(low), None if high is None else int(high))
    if kind == "integer":
        return ints
    return ints | st.floats(low, high, allow_nan=False, allow_infinity=False)


def _object(schema: Schema, components: Schema) -> st.SearchStrategy[Any]:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    fixed = {k: from_schema(v, components) for k, v in properties.items() if k in required}
    optional = {k: from_schema(v, components) for k, v in properties.items() if k not in required}
    base = st.fixed_dictionaries(fixed, optional=optional)
    if properties or schema.get("additionalProperties") is False:
        return base
    return st.dictionaries(st.text(max_size=10), ANY_JSON, max_size=4)


def invalid_body(schema: Schema, components: Schema) -> st.SearchStrategy[Any]:
    """Bodies that break the schema: a field of the wrong kind, an unknown field, no object."""
    valid = from_schema(schema, components)

    def spoil(draw: Any) -> Any:
        value = draw(valid)
        if not isinstance(value, dict) or draw(st.booleans()):
            return draw(ANY_JSON)
        keys = sorted(value) or ["x"]
        name = draw(st.sampled_from([*keys, "unknown_field"]))
        return {**value, name: draw(ANY_JSON)}

    return st.composite(lambda draw: spoil(draw))()


def path_value(schema: Schema, components: Schema) -> st.SearchStrategy[str]:
    """A path parameter: valid for its schema, or any text (URL-quoted either way)."""
    valid = from_schema(schema, components).map(str)
    odd = st.text(alphabet=string.printable, min_size=1, max_size=MAX_TEXT)
    ids = st.from_regex(r"[a-z0-9]{1,10}:[0-9A-HJKMNP-TV-Z]{26}", fullmatch=True)
    return st.one_of(valid, odd, ids).map(lambda s: quote(s, safe=":"))


def header_value() -> st.SearchStrategy[str]:
    """Any value an HTTP header may carry."""
    edge = r"A-Za-z0-9.:_/=+\-"
    return st.from_regex(rf"([{edge}]([{edge} ]{{0,38}}[{edge}])?)?", fullmatch=True)
