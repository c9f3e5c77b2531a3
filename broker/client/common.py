"""What the synchronous and the asyncio client share: turning what a producer passes into
validated requests, the batches they are written in, and a task id's keys."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from broker.ids import split_task_id
from broker.keys import CapabilityKeys
from broker.protocol.submit import (
    SubmitFields,
    SubmitOptions,
    SubmitRequest,
    build_submit_request,
    options_of,
)
from broker.settings import Settings

SUBMIT_BATCH = 200
"""Most tasks one submit call writes (a script blocks Redis while it runs)."""


def requests_for(settings: Settings, capability: str, payloads: Iterable[Any],
                 options: SubmitOptions | None, fields: SubmitFields,
                 wait: bool = False) -> list[SubmitRequest]:
    """Every payload validated (BadInput before anything is written), as requests."""
    chosen = options_of(options, fields)
    return [build_submit_request(settings, capability, payload, chosen, wait=wait)
            for payload in payloads]


def batches(requests: Sequence[SubmitRequest]) -> Iterator[Sequence[SubmitRequest]]:
    for start in range(0, len(requests), SUBMIT_BATCH):
        yield requests[start:start + SUBMIT_BATCH]


def task_keys(settings: Settings, task_id: str) -> tuple[CapabilityKeys, str]:
    """The task's capability keys and local id (InvalidTaskId for a malformed id)."""
    capability, local = split_task_id(task_id)
    return CapabilityKeys(settings.prefix, capability), local


CANCEL_FOLLOWS = 10
"""How often a cancel follows a task that moved to another agent meanwhile."""
