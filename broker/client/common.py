"""What the synchronous and the asyncio client share: turning what a producer passes into
validated requests, the batches they are written in, and a task id's keys."""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from broker.ids import split_task_id
from broker.keys import CapabilityKeys
from broker.policy import fields_set
from broker.protocol.packed_policy import FleetItems, fleet_items
from broker.protocol.submit import SubmitOptions, SubmitRequest, build_submit_request
from broker.settings import Settings

log = logging.getLogger("reach.client")

SUBMIT_BATCH = 200
"""Most tasks one submit call writes (a script blocks Redis while it runs)."""


def requests_for(settings: Settings, capability: str, payloads: Iterable[Any],
                 options: SubmitOptions, wait: bool = False) -> list[SubmitRequest]:
    """Every payload validated (BadInput before anything is written), as requests."""
    return [build_submit_request(settings, capability, payload, options, wait=wait)
            for payload in payloads]


def batches(requests: Sequence[SubmitRequest]) -> Iterator[Sequence[SubmitRequest]]:
    for start in range(0, len(requests), SUBMIT_BATCH):
        yield requests[start:start + SUBMIT_BATCH]


def task_keys(settings: Settings, task_id: str) -> tuple[CapabilityKeys, str]:
    """The task's capability keys and local id (InvalidTaskId for a malformed id)."""
    capability, local = split_task_id(task_id)
    return CapabilityKeys(settings.prefix, capability), local



def unserved_warning(capability: str, served: Iterable[str]) -> str:
    """What to say of a capability no agent has ever served (a typo, often), naming the
    closest names that agents do serve."""
    close = difflib.get_close_matches(capability, sorted(served), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else ""
    return (f"no agent has ever served capability {capability!r}{hint}; its tasks wait, and fail "
            "as no_agent_timeout if no agent comes")


FLEET_POLICY_TTL_S = 1.0


class FleetPolicy:
    """The fields of the fleet's policy (broker/policy.py) as a producer last read them, at
    most once a second: the scripts' fallback while a capability's own policy hash is not
    filled yet (a dispatcher fills it), so that a new capability's first tasks follow the
    fleet's policy, not the producer's environment."""

    def __init__(self) -> None:
        self.fields: FleetItems = ()
        self._until = 0.0

    def stale(self) -> bool:
        return time.monotonic() >= self._until

    def take(self, raw: Any) -> FleetItems:
        self.fields = fleet_items(fields_set(raw or {}))
        self._until = time.monotonic() + FLEET_POLICY_TTL_S
        return self.fields
