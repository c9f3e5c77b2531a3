"""Limits on the JSON that crosses a trust boundary: how deep it nests and how many bytes it
takes. One checker for the client (submit), the gateway (request bodies) and the worker (results,
progress), so that the three refuse the same things with the same words.

The depth check is made for the hot path: a text holding no more opening brackets than the limit
cannot nest deeper than it, and two `count` calls (C speed) say so for nearly every payload. Only
a text with more brackets than that is measured, in one pass that strips strings with a regular
expression and sums the brackets left (also C speed: no Python loop per character).
"""

from __future__ import annotations

import re
from array import array
from itertools import accumulate

from broker.errors import InvalidPayload, NestedTooDeep, PayloadTooLarge

DEFAULT_MAX_DEPTH = 64

# A JSON string (its escapes included), as bytes: what is inside it is no nesting. An unclosed
# one runs to the end of the text: every match then succeeds at its first try, so the scan stays
# linear whatever the text (a pattern that must find the closing quote is quadratic on `"\"\"...`).
_STRING = re.compile(rb'"[^"\\]*(?:\\[\s\S]?[^"\\]*)*(?:"|\Z)')
# Brackets as steps of +1 (opening) and -1 (closing, 0xff as a signed byte); everything else out.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(text: str | bytes) -> int:
    """How deep a JSON text nests (0 for a scalar, 1 for `[]` or `{"a": 1}`). For text that is
    not JSON it is an estimate (its parser refuses such text anyway)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    steps = _STRING.sub(b"", data).translate(_STEPS, _NOT_BRACKETS)
    return max(accumulate(array("b", steps), initial=0))


def nests_deeper(text: str | bytes, limit: int) -> bool:
    """Whether a JSON text nests deeper than `limit` (cheap when it has few brackets)."""
    if isinstance(text, str):
        opening = text.count("[") + text.count("{")
    else:
        opening = text.count(b"[") + text.count(b"{")
    return opening > limit and nesting_depth(text) > limit


def check_depth(text: str | bytes, limit: int, where: str = "payload") -> None:
    """NestedTooDeep naming `where` when the JSON text nests deeper than `limit`."""
    if nests_deeper(text, limit):
        raise NestedTooDeep(f"{where} nests {nesting_depth(text)} levels deep, over the limit of "
                            f"{limit} (max_json_depth)")


def check_size(size: int, limit: int, where: str = "payload", setting: str = "max_payload_bytes") -> None:
    """PayloadTooLarge naming `where` and the setting when `size` bytes are over `limit`."""
    if size > limit:
        raise PayloadTooLarge(f"{where} is {size} bytes of JSON, over the limit of {limit} bytes "
                              f"({setting})")


def check_text(text: str, max_bytes: int, max_depth: int, where: str = "payload",
               setting: str = "max_payload_bytes") -> None:
    """Both limits on an encoded JSON text (size first: it is the cheaper to tell)."""
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayload(f"{where} holds a lone surrogate (text that is not valid Unicode, "
                             "which UTF-8 cannot carry)") from None
    check_size(size, max_bytes, where, setting)
    check_depth(text, max_depth, where)
