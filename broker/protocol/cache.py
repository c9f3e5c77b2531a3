"""What the call builders work out once per Settings object and reuse on every call (key names,
fixed arguments): the hot paths build a call per task or per report."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from broker.settings import Settings

T = TypeVar("T")

# Per Settings object (by identity: a pydantic model is not hashable), dropped with it.
_caches: dict[int, tuple[weakref.ref[Settings], dict[Hashable, Any]]] = {}
_lock = threading.Lock()
_MOST = 1024
"""Entries kept per Settings object (a process with many capabilities starts over past it)."""


def cached(settings: Settings, key: Hashable, build: Callable[[], T]) -> T:
    """`build()`'s value for `key` under these settings, built once."""
    with _lock:
        entry = _caches.get(id(settings))
        if entry is None or entry[0]() is not settings:
            entry = (weakref.ref(settings), {})
            _caches[id(settings)] = entry
            weakref.finalize(settings, _caches.pop, id(settings), None)
        known = entry[1]
        if key in known:
            value: T = known[key]
            return value
    value = build()
    with _lock:
        if len(known) >= _MOST:
            known.clear()
        known[key] = value
    return value
