"""`reach-worker --a2a URL`: which capabilities the agent serves, read from its card at start.

With no `--capability`, every skill of the card becomes a capability, so the card must be read
before the worker can register: it is asked for until it answers (an agent started a moment
after its worker). With `--capability`, the card is asked for once, for the skills'
descriptions; the worker starts either way and stays not_ready until the card answers.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
from a2a.types import AgentCard

from agent_worker.a2a.agent import A2aAgent
from agent_worker.a2a.cards import CardUnavailable, fetch_card, skill_capabilities
from agent_worker.a2a.options import A2aOptions
from broker.errors import ConfigError

log = logging.getLogger("reach.worker")
FIRST_WAIT_S = 0.5
LONGEST_WAIT_S = 10.0


async def read_card(url: str, headers: tuple[tuple[str, str], ...], wait: bool) -> AgentCard | None:
    """The card at `url`; with `wait`, asked for until it answers, else None when it does not."""
    pause = FIRST_WAIT_S
    async with httpx.AsyncClient() as client:
        while True:
            try:
                return await fetch_card(client, url, headers)
            except CardUnavailable as exc:
                if not wait:
                    log.warning("cannot read the agent card at %s yet (%s); not ready until it answers",
                                url, exc)
                    return None
                log.warning("cannot read the agent card at %s (%s); asking again in %.1fs", url, exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_WAIT_S)


def a2a_agents(url: str, capabilities: list[str], skill: str | None, headers: list[str] | None
               ) -> tuple[list[str], dict[str, A2aAgent]]:
    """The capabilities to serve and the A2A agent behind each (reads the card: see above)."""
    if skill is not None and len(capabilities) != 1:
        raise ConfigError("--skill names the skill of one --capability: give exactly one --capability")
    base = A2aOptions.build(url, skill or "", headers)
    card = asyncio.run(read_card(base.url, base.headers, wait=not capabilities))
    if capabilities:
        names = {c.partition("=")[0]: skill or c.partition("=")[0] for c in capabilities}
    else:
        assert card is not None  # (waited for)
        names = skill_capabilities(card)
        log.info("serving the skills of %s: %s", card.name or url,
                 ", ".join(f"{c} <- {s}" for c, s in names.items()))
    agents = {name: A2aAgent(A2aOptions(base.url, skill_id, base.headers), card)
              for name, skill_id in names.items()}
    return list(names), agents
