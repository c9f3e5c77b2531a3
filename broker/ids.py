"""Task ids: `<capability>:<ULID>`.

The capability is part of the id so that `reach status ID` (and `client.get(id)`) find the task's
keys without being told its capability, and so that every key of a task shares the capability's
Redis Cluster hash tag. The ULID part (48-bit millisecond time + 80 random bits, Crockford
base32) sorts by creation time, which breaks priority ties first-in first-out (strictly, for
the ids of one process).
"""

from __future__ import annotations

import os
import re
import threading
import time

from broker.errors import InvalidCapability, InvalidTaskId

CAPABILITY_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}\Z")
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_LOCAL_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}\Z")
# (Two characters, ten bits, at a time: 13 lookups instead of 26 for a submit's id.)
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
_PAIR_SHIFTS = range(120, -1, -10)


def check_capability(name: object) -> str:
    if not isinstance(name, str) or not CAPABILITY_RE.match(name):
        raise InvalidCapability(
            f"invalid capability name {name!r}: use 1-64 characters of a-z, 0-9, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


_last = 0
_last_lock = threading.Lock()


def new_local_id(now_ms: int | None = None) -> str:
    """A new ULID. Ids made by one process only ever increase (within a millisecond the random
    part counts up, as in ULID's monotonic mode): two tasks submitted in the same millisecond
    with the same priority tie in the queue's score, and their ids keep them first-in first-out."""
    global _last
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    if now_ms is None:
        with _last_lock:
            if value <= _last:
                value = _last + 1
            _last = value
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])


def new_task_id(capability: str) -> str:
    return f"{capability}:{new_local_id()}"


def is_local_id(local: str) -> bool:
    """Whether `local` is the local part of a task id (a 26-character ULID)."""
    return _LOCAL_RE.match(local) is not None


def split_task_id(task_id: object) -> tuple[str, str]:
    """(capability, local id) of a task id, or InvalidTaskId."""
    if not isinstance(task_id, str) or task_id.count(":") != 1:
        raise InvalidTaskId(f"invalid task id {task_id!r}: expected '<capability>:<26-char id>'")
    capability, local = task_id.split(":")
    if not CAPABILITY_RE.match(capability) or not _LOCAL_RE.match(local):
        raise InvalidTaskId(f"invalid task id {task_id!r}: expected '<capability>:<26-char id>'")
    return capability, local


def local_id_ms(local: str) -> int:
    """When a local id was made (its ULID's 48-bit millisecond time: the submit's time, by the
    producer's clock)."""
    return int(local[:10].translate(_DECODE), 32)


# Crockford base32 as int(..., 32) reads it (its digits 0-9 then a-v).
_DECODE = str.maketrans(_ALPHABET, "0123456789abcdefghijklmnopqrstuv")
