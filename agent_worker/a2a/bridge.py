"""What the A2A agents of one worker share: one pooled httpx client (sized to the worker's
concurrency), the agents' cards, an A2A client per agent, and their readiness.

Each card is fetched again on the heartbeat cadence (agent_worker/http_bridge/readiness.py
runs the probes): while one cannot be fetched, or lacks a skill this worker serves, the worker
starts nothing new, hands its unread tasks back and is `not_ready`; a task call that cannot
connect probes at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import AgentCard
from a2a.utils.constants import TransportProtocol

from agent_worker.a2a.cards import CardUnavailable, fetch_card, find_skill
from agent_worker.a2a.options import A2aOptions
from agent_worker.http_bridge.bridge import ReadinessGate, WorkerLink
from agent_worker.http_bridge.options import CONNECT_TIMEOUT_S, PROBE_TIMEOUT_S
from agent_worker.http_bridge.readiness import Probe, Readiness

log = logging.getLogger("reach.worker")


class CardCache:
    """The last card fetched of each agent (by base URL)."""

    def __init__(self) -> None:
        self.cards: dict[str, AgentCard] = {}

    def get(self, url: str) -> AgentCard | None:
        return self.cards.get(url)


@dataclass(frozen=True, slots=True)
class CardProbe(Probe):
    """Fetch an agent's card (and find the skills served in it); the readiness probe of an A2A
    agent."""

    base: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    skills: frozenset[str] = frozenset()
    cards: CardCache = field(default_factory=CardCache, compare=False, hash=False)

    def __str__(self) -> str:
        return f"card {self.url}"

    async def check(self, client: httpx.AsyncClient) -> str | None:
        try:
            card = await fetch_card(client, self.base, self.headers, PROBE_TIMEOUT_S)
        except CardUnavailable as exc:
            return f"cannot fetch the agent card {self.url}: {exc}"
        missing = sorted(s for s in self.skills if find_skill(card, s) is None)
        self.cards.cards[self.base] = card
        if missing:
            return f"the agent card {self.url} has no skill {', '.join(map(repr, missing))}"
        return None


class BridgedAgent(Protocol):
    """What the bridge needs of an A2A agent (agent.py's A2aAgent)."""

    options: A2aOptions
    card: AgentCard | None

    def attach(self, bridge: A2aBridge) -> None: ...


class A2aBridge(ReadinessGate):
    KIND = "A2A"

    def __init__(self, link: WorkerLink, agents: Sequence[BridgedAgent]) -> None:
        self.link = link
        concurrency = link.slots.concurrency
        self.http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency,
                                keepalive_expiry=30.0),
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S), follow_redirects=False)
        self.cards = CardCache()
        self._clients: dict[str, tuple[AgentCard, Client]] = {}
        by_url: dict[str, list[A2aOptions]] = {}
        for agent in agents:
            by_url.setdefault(agent.options.url, []).append(agent.options)
            if agent.card is not None:
                self.cards.cards.setdefault(agent.options.url, agent.card)
        probes = [CardProbe(url=opts[0].card_url, base=url, headers=opts[0].headers,
                            skills=frozenset(o.skill for o in opts), cards=self.cards)
                  for url, opts in by_url.items()]
        self.readiness = Readiness(list(probes), link.settings.heartbeat_ms / 1000, self._ready_changed,
                                   self._hand_back)
        link.slots.pause()  # (until the first probe passes)
        for agent in agents:
            agent.attach(self)

    def client_for(self, options: A2aOptions) -> tuple[AgentCard, Client] | None:
        """The agent's card and an A2A client for it (None until its card was fetched)."""
        card = self.cards.get(options.url)
        if card is None:
            return None
        known = self._clients.get(options.url)
        if known is None or known[0] is not card:  # (a card fetched anew may name other endpoints)
            config = ClientConfig(httpx_client=self.http, streaming=True,
                                  supported_protocol_bindings=[TransportProtocol.JSONRPC,
                                                               TransportProtocol.HTTP_JSON])
            known = (card, ClientFactory(config).create(card))
            self._clients[options.url] = known
        return known


    # -- lifecycle --------------------------------------------------------------------------

    def jobs(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {"a2a-readiness": self.readiness.run}

    async def aclose(self) -> None:
        await self.http.aclose()
