"""The no-op task of the Python peers: returns its payload, as Reach's `echo` does."""

from __future__ import annotations

from typing import Any


def noop(payload: Any) -> Any:
    return payload
