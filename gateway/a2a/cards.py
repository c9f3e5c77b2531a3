"""The gateway's agent cards: the fleet's (every live capability a skill) and one per capability.

    GET /.well-known/agent-card.json                 the fleet: JSON-RPC at /a2a, HTTP+JSON at /a2a/rest
    GET /a2a/agents/<capability>/.well-known/agent-card.json
                                                     one capability: /a2a/agents/<capability>(/rest)

A skill's input and output JSON Schemas ride in the card's skill-schema extension (A2A's
AgentSkill has no field for them), which `reach-worker --a2a` reads back. The security scheme
says what the gateway asks: a Bearer API key, unless it runs with no keys (a loopback gateway
with none made yet, or --insecure-no-auth).
"""

from __future__ import annotations

from typing import Any

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_1_0, TransportProtocol

from agent_worker.a2a.cards import SKILL_SCHEMAS_URI
from broker import codec
from broker.ops.catalog import CapabilityRow

FLEET_PATH = "/a2a"
AGENTS_PATH = "/a2a/agents"
REST_SUFFIX = "/rest"
SCHEME = "bearer"
INPUT_MODES = ["application/json", "text/plain"]
OUTPUT_MODES = ["application/json"]
_VERSION = "0.1.0"


def skill(row: CapabilityRow) -> AgentSkill:
    d = row.description
    text = d.description or f"The Reach capability {row.capability!r}: a JSON payload in, a JSON result out."
    return AgentSkill(id=row.capability, name=row.capability, description=text, tags=["agent-reach"],
                      examples=[codec.dumps(e) for e in d.examples[:10]], input_modes=INPUT_MODES,
                      output_modes=OUTPUT_MODES)


def _schemas(rows: list[CapabilityRow]) -> AgentExtension:
    params: dict[str, Any] = {}
    for row in rows:
        d = row.description
        entry = {k: v for k, v in (("input_schema", d.input_schema), ("output_schema", d.output_schema)) if v}
        if entry:
            params[row.capability] = entry
    extension = AgentExtension(uri=SKILL_SCHEMAS_URI, required=False,
                               description="The JSON Schemas of each skill's payload (the message's data "
                                           "part) and result (the artifact's data part)")
    extension.params.update(params)
    return extension


def _card(name: str, description: str, url: str, rows: list[CapabilityRow], secured: bool) -> AgentCard:
    card = AgentCard(
        name=name, description=description, version=_VERSION,
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC.value,
                           protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=url + REST_SUFFIX, protocol_binding=TransportProtocol.HTTP_JSON.value,
                           protocol_version=PROTOCOL_VERSION_1_0)],
        provider=AgentProvider(organization="Agent-Reach", url=url),
        capabilities=AgentCapabilities(streaming=True, push_notifications=False, extensions=[_schemas(rows)]),
        default_input_modes=INPUT_MODES, default_output_modes=OUTPUT_MODES,
        skills=[skill(row) for row in rows])
    if secured:
        card.security_schemes[SCHEME].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", description="An API key of this gateway (`reach keys create --role producer`)")))
        card.security_requirements.append(SecurityRequirement(schemes={SCHEME: StringList()}))
    return card


def fleet_card(base: str, rows: list[CapabilityRow], secured: bool) -> AgentCard:
    return _card("Agent-Reach fleet",
                 "Every capability of this Reach fleet, as a skill. Name the skill in the message's "
                 'metadata ({"skill": "<capability>"}), or talk to one capability at '
                 f"{base}{AGENTS_PATH}/<capability>. A data part is the task's payload; a text part "
                 'stands for {"text": ...}.', base + FLEET_PATH, rows, secured)


def capability_card(base: str, row: CapabilityRow, secured: bool) -> AgentCard:
    text = row.description.description or f"The Reach capability {row.capability!r}."
    return _card(row.capability, text, f"{base}{AGENTS_PATH}/{row.capability}", [row], secured)
