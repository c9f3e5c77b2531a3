"""Strict JSON, the only wire format.

Payloads and results must be JSON values as they are: NaN/Infinity, bytes, sets, non-string
object keys and other Python objects are refused with a message naming where they sit, never
converted. (Tuples are written as arrays, as every JSON library does.)
"""

from __future__ import annotations

import json
import math
from typing import Any

from broker import limits
from broker.errors import InvalidPayload, NestedTooDeep

_SCALARS = (str, int, float, bool, type(None))


class NotStrictJson(ValueError):
    """A value is not strict JSON; the message says where and why."""


def check_json_value(value: Any, where: str = "payload") -> None:
    """Raise NotStrictJson if `value` is not a strict-JSON value."""
    if not _is_strict(value):
        _explain(value, where)
        raise NotStrictJson(f"{where} is not strict JSON")  # (_explain names where, always)


# Items the plain walk takes before it looks for a circular reference (which would make it
# endless): far more than a payload within the size limit holds, unless it repeats values.
_PLAIN_WALK_ITEMS = 200_000


def _is_strict(value: Any) -> bool:
    """Whether `value` is strict JSON: the walk every payload and result takes, without the
    path names that only a refusal needs (building them cost more than the rest). A walk that
    runs long is redone keeping the containers it is inside (_is_strict_acyclic); keeping them
    always cost two to four times the plain walk."""
    stack = [value]
    budget = _PLAIN_WALK_ITEMS
    while stack:
        budget -= 1
        if budget < 0:
            return _is_strict_acyclic(value)
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, _SCALARS):
            continue
        elif isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return False
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            return False
    return True


class _Leave:
    """Marks, on a walk's stack, where the walk leaves a container (its id)."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key


def _is_strict_acyclic(value: Any) -> bool:
    """_is_strict, keeping the containers the walk is inside: one met again inside itself is a
    circular reference, which JSON cannot hold; a value merely used twice is fine."""
    stack: list[Any] = [value]
    inside: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, _SCALARS):
            continue
        elif isinstance(item, _Leave):
            inside.discard(item.key)
        elif isinstance(item, dict | list | tuple):
            key = id(item)
            if key in inside:
                return False
            if isinstance(item, dict):
                for name in item:
                    if not isinstance(name, str):
                        return False
                children: Any = item.values()
            else:
                children = item
            inside.add(key)
            stack.append(_Leave(key))
            stack.extend(children)
        else:
            return False
    return True


def _explain(value: Any, where: str) -> None:
    """Raise NotStrictJson naming where `value` first fails to be strict JSON."""
    stack: list[tuple[Any, str]] = [(value, where)]
    inside: set[int] = set()
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise NotStrictJson(f"{path} is {item!r}, which JSON cannot represent")
        elif isinstance(item, _SCALARS):
            continue
        elif isinstance(item, _Leave):
            inside.discard(item.key)
        elif isinstance(item, dict | list | tuple) and id(item) in inside:
            raise NotStrictJson(f"{path} is the object or array that holds it (a circular "
                                "reference, which JSON cannot represent)")
        elif isinstance(item, dict):
            inside.add(id(item))
            stack.append((_Leave(id(item)), path))
            for key, child in item.items():
                if not isinstance(key, str):
                    raise NotStrictJson(
                        f"{path} has a non-string key {key!r} ({type(key).__name__}); "
                        "JSON object keys must be strings"
                    )
                stack.append((child, f"{path}[{key!r}]"))
        elif isinstance(item, list | tuple):
            inside.add(id(item))
            stack.append((_Leave(id(item)), path))
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
        else:
            raise NotStrictJson(
                f"{path} is a {type(item).__name__}, which is not a JSON value "
                "(use objects, arrays, strings, numbers, booleans or null)"
            )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


# One encoder and one decoder for the process: json.dumps/loads with options build new ones
# on every call, which costs more than the work on small payloads.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def dumps(value: Any) -> str:
    """Compact JSON text of a value already known to be strict JSON."""
    return _ENCODER.encode(value)


def encode_payload(value: Any, max_bytes: int, where: str = "payload",
                   max_depth: int = limits.DEFAULT_MAX_DEPTH, setting: str = "max_payload_bytes") -> str:
    """Validate and encode a payload; InvalidPayload (PayloadTooLarge, NestedTooDeep) says
    exactly what is wrong. `setting`: the limit's name, for the message."""
    try:
        check_json_value(value, where)
    except NotStrictJson as exc:
        raise InvalidPayload(str(exc)) from None
    try:
        text = dumps(value)
    except RecursionError:
        raise NestedTooDeep(f"{where} is nested too deeply to encode (the limit is "
                                   f"{max_depth}, max_json_depth)") from None
    limits.check_text(text, max_bytes, max_depth, where, setting)
    return text


def loads(text: str | bytes) -> Any:
    """Parse strict JSON (NaN and Infinity are refused). A text nested too deeply for the parser
    is a ValueError like any other that is not JSON (not a RecursionError, which callers that
    read strangers' data would not expect)."""
    if not isinstance(text, str):
        text = text.decode("utf-8")  # (as json.loads does; its UTF-16/32 sniffing is not needed)
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


_EXACT_INT = 2**53


def whole_numbers(value: Any) -> Any:
    """`value` with every float that has no fraction (within 2**53) made an int: protobuf's
    Struct (A2A's data parts) carries every JSON number as a double, so 3 arrives as 3.0."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= _EXACT_INT else value
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value
