"""Routing decisions taken ahead of time, as the scripts keep them, and how a decision is told.

A **grant** is an inbox slot a dispatcher's round left for submit.lua to fill while the ready
queue is empty (lua/_handoff.lua), one list entry each, in the order they are to be used:

    <agent>|<most unread entries>|<round>|<score>|<low>[|<most entries in flight>]

The last field, when there (and not 0), bounds the agent's inbox length (read and unread
entries: its slots plus the prefetch the dispatcher allows it): a grant written while the agent
had a free slot is dropped unused once its slots filled another way.

A **pull** stands for one agent (lua/_pull.lua): while tasks wait in the queue, its report of
finished tasks takes the next plain tasks from the queue into its inbox. The pulls hash maps
the agent id to

    <most unread entries>|<round>|<score>|<low>

`low` is '1' for a cold agent (recovered lately): it takes low-priority tasks only. `round` names
the routing round's snapshot (see `reach explain`).

An **explanation** is what a task's record keeps of the decision that placed it (field
`explain`): `<round>|<why>|<score>|<eligible agents>`; `why` is `grant` or `pull` for tasks the
scripts handed on (with an empty `eligible`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.keys import CapabilityKeys
from broker.protocol.calls import ScriptCall
from broker.settings import Settings


@dataclass(frozen=True, slots=True)
class Grant:
    agent_id: str
    max_unread: int
    round_id: str
    score: float
    low_only: bool = False
    max_inflight: int = 0
    """The most entries its inbox may hold for the grant to be used (0: no bound)."""

    def encode(self) -> str:
        low = "1" if self.low_only else ""
        text = f"{self.agent_id}|{self.max_unread}|{self.round_id}|{self.score:g}|{low}"
        return f"{text}|{self.max_inflight}" if self.max_inflight else text

    @classmethod
    def parse(cls, text: str) -> Grant | None:
        parts = text.split("|")
        if len(parts) not in (5, 6) or not parts[0]:
            return None
        try:
            inflight = int(parts[5]) if len(parts) == 6 else 0
            return cls(parts[0], int(parts[1]), parts[2], float(parts[3] or 0), parts[4] == "1",
                       inflight)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class Pull:
    max_unread: int
    round_id: str
    score: float
    low_only: bool = False

    def encode(self) -> str:
        return f"{self.max_unread}|{self.round_id}|{self.score:g}|{'1' if self.low_only else ''}"

    @classmethod
    def parse(cls, text: str) -> Pull | None:
        parts = text.split("|")
        if len(parts) != 4:
            return None
        try:
            return cls(int(parts[0]), parts[1], float(parts[2] or 0), parts[3] == "1")
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class Explanation:
    round_id: str
    why: str
    score: float | None
    eligible: int | None

    def encode(self) -> str:
        score = "" if self.score is None else f"{self.score:g}"
        eligible = "" if self.eligible is None else str(self.eligible)
        return f"{self.round_id}|{self.why}|{score}|{eligible}"

    @classmethod
    def parse(cls, text: str | None) -> Explanation | None:
        if not text:
            return None
        parts = text.split("|")
        if len(parts) != 4:
            return None
        round_id, why, score, eligible = parts
        try:
            return cls(round_id, why, float(score) if score else None,
                       int(eligible) if eligible else None)
        except ValueError:
            return None

    def as_dict(self) -> dict[str, Any]:
        return {"round": self.round_id or None, "why": self.why, "score": self.score,
                "eligible": self.eligible}


@dataclass(frozen=True, slots=True)
class GrantReply:
    standing: int
    """Grants in the set now."""
    unused_probes: tuple[str, ...]
    """Of the agents asked about, those whose probe grant the replaced set still held unused."""


def grant_call(settings: Settings, capability: str, grants: Sequence[Grant], ttl_ms: int,
               probes: Sequence[str] = ()) -> ScriptCall:
    """Replace the capability's grants (in order of use), carrying over the probe grants of the
    agents `probes` that the set replaced still held unused (see grant.lua)."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("grant", [ck.grants, ck.granted],
                      [ttl_ms, len(probes), *probes, *(g.encode() for g in grants)])


def parse_grant(reply: list[Any]) -> GrantReply:
    return GrantReply(int(reply[0]), tuple(str(agent) for agent in reply[1:]))


def pulls_call(settings: Settings, capability: str, pulls: dict[str, Pull], ttl_ms: int) -> ScriptCall:
    """Replace the capability's standing pulls (agent id -> its pull)."""
    args: list[str | int | float] = [ttl_ms]
    for agent_id, pull in pulls.items():
        args += [agent_id, pull.encode()]
    return ScriptCall("pulls", [CapabilityKeys(settings.prefix, capability).pulls], args)
