"""Reach's capabilities as MCP tools, and a task's end as a tool's result (pure functions).

A tool's input schema is its capability's (MCP's are JSON objects: a payload that is not one
goes in an argument `payload`); with none registered, the arguments are the payload. The result
is the task's, as JSON text and as structured content (an object result as it is, anything else
as {"result": ...}); a failed task is a tool error whose text is Reach's reason and error.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from broker import codec
from broker.ops.catalog import CapabilityRow

PAYLOAD_ARGUMENT = "payload"
_ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}


def _is_object_schema(schema: dict[str, Any] | None) -> bool:
    return bool(schema) and schema is not None and schema.get("type") == "object"


def input_schema(row: CapabilityRow) -> tuple[dict[str, Any], bool]:
    """(the tool's input schema, whether the payload is wrapped in `payload`)."""
    schema = row.description.input_schema
    if not schema:
        return dict(_ANY_OBJECT), False
    if _is_object_schema(schema):
        return schema, False
    return {"type": "object", "properties": {PAYLOAD_ARGUMENT: schema}, "required": [PAYLOAD_ARGUMENT]}, True


def output_schema(row: CapabilityRow) -> dict[str, Any] | None:
    schema = row.description.output_schema
    if not schema:
        return None
    if _is_object_schema(schema):
        return schema
    return {"type": "object", "properties": {"result": schema}, "required": ["result"]}


def tool(row: CapabilityRow) -> types.Tool:
    text = row.description.description or f"The Reach capability {row.capability!r}."
    return types.Tool(name=row.capability, description=text, input_schema=input_schema(row)[0],
                      output_schema=output_schema(row))


def payload_of(row: CapabilityRow, arguments: dict[str, Any] | None) -> Any:
    arguments = arguments or {}
    _, wrapped = input_schema(row)
    return arguments.get(PAYLOAD_ARGUMENT) if wrapped else arguments


def success(row: CapabilityRow, result: Any) -> types.CallToolResult:
    wrapped = output_schema(row) is not None and not _is_object_schema(row.description.output_schema)
    structured = {"result": result} if wrapped else result if isinstance(result, dict) else None
    return types.CallToolResult(content=[types.TextContent(type="text", text=codec.dumps(result))],
                                structured_content=structured)


def failure(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text[:4000])], is_error=True)
