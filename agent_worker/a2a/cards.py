"""A remote agent's card: fetching it, and what its skills mean to Reach (capabilities, with
their descriptions).

A skill's id becomes the capability's name when it is one (lower case letters, digits, `_.-`);
otherwise it is made into one (`Translate Text` -> `translate-text`). A skill may carry its
input's JSON Schema in the card's skill-schema extension (the one Reach's gateway writes:
gateway/a2a/cards.py), which Reach registers as the capability's input schema.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import httpx
from a2a.client import A2ACardResolver
from a2a.client.errors import AgentCardResolutionError
from a2a.types import AgentCard, AgentSkill
from google.protobuf.json_format import MessageToDict

from broker.codec import whole_numbers
from broker.errors import ConfigError
from broker.ids import CAPABILITY_RE
from broker.models import CapabilityDescription

SKILL_SCHEMAS_URI = "urn:agent-reach:a2a:skill-schemas:v1"
"""The card extension whose params map skill ids to {input_schema, output_schema}."""
_NOT_NAME = re.compile(r"[^a-z0-9_.-]+")


class CardUnavailable(Exception):
    """The card cannot be fetched or read; the message says why."""


async def fetch_card(client: httpx.AsyncClient, url: str, headers: Sequence[tuple[str, str]] = (),
                     timeout_s: float = 5.0) -> AgentCard:
    """The agent card at `url` (its base URL); CardUnavailable when it cannot be had."""
    resolver = A2ACardResolver(client, url)
    try:
        return await resolver.get_agent_card(http_kwargs={"headers": dict(headers), "timeout": timeout_s})
    except AgentCardResolutionError as exc:
        raise CardUnavailable(str(exc.message)[:300]) from None
    except (httpx.HTTPError, OSError, ValueError) as exc:
        raise CardUnavailable(f"{type(exc).__name__}: {exc}"[:300]) from None


def capability_name(skill_id: str) -> str:
    """The capability name a skill id stands for."""
    if CAPABILITY_RE.match(skill_id):
        return skill_id
    name = _NOT_NAME.sub("-", skill_id.strip().lower()).strip("-_.")[:64]
    if not CAPABILITY_RE.match(name):
        raise ConfigError(f"skill {skill_id!r} cannot be made into a capability name; serve it with "
                          f"--capability NAME --a2a URL --skill {skill_id!r}")
    return name


def skill_capabilities(card: AgentCard) -> dict[str, str]:
    """capability name -> skill id, for every skill of the card."""
    out: dict[str, str] = {}
    for skill in card.skills:
        name = capability_name(skill.id)
        if name in out:
            raise ConfigError(f"skills {out[name]!r} and {skill.id!r} of the card both make capability "
                              f"{name!r}: serve them one at a time with --capability NAME --skill ID")
        out[name] = skill.id
    if not out:
        raise ConfigError(f"the agent card of {card.name or 'the agent'} lists no skills: name one "
                          "with --capability NAME --a2a URL --skill ID")
    return out


def find_skill(card: AgentCard, skill_id: str) -> AgentSkill | None:
    return next((s for s in card.skills if s.id == skill_id), None)


def skill_description(card: AgentCard, skill_id: str) -> CapabilityDescription:
    """What the card says of one skill (its description, examples and, when the card carries
    them, its schemas)."""
    skill = find_skill(card, skill_id)
    if skill is None:
        return CapabilityDescription()
    schemas = _skill_schemas(card).get(skill_id, {})
    return CapabilityDescription(
        description=(skill.description or skill.name or None),
        input_schema=_object_or_none(schemas.get("input_schema")),
        output_schema=_object_or_none(schemas.get("output_schema")),
        examples=list(skill.examples)[:20],
    )


def _skill_schemas(card: AgentCard) -> dict[str, dict[str, Any]]:
    for extension in card.capabilities.extensions:
        if extension.uri == SKILL_SCHEMAS_URI:
            params = whole_numbers(MessageToDict(extension.params))
            return {k: v for k, v in params.items() if isinstance(v, dict)}
    return {}


def _object_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None
