"""`reach-worker --a2a URL [--skill S] [--a2a-header 'Name: value']`: which A2A agent serves a
capability, and how to reach it (header values may name environment variables; never logged)."""

from __future__ import annotations

from dataclasses import dataclass

from agent_worker.http_bridge.options import check_url, parse_header

CARD_PATH = "/.well-known/agent-card.json"
CANCEL_TIMEOUT_S = 3.0
"""How long canceling the remote task may take when a Reach attempt is canceled or times out."""
POLL_FIRST_S = 0.2
POLL_MAX_S = 5.0
"""A remote agent that does not stream is asked for its task's state this often (backing off)."""


@dataclass(frozen=True)
class A2aOptions:
    url: str
    """The agent's base URL (its card is at <url>/.well-known/agent-card.json)."""
    skill: str
    """The skill of its card that serves the capability."""
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def build(cls, url: str, skill: str, headers: list[str] | None = None,
              environ: dict[str, str] | None = None) -> A2aOptions:
        return cls(url=check_url(url, "--a2a").rstrip("/"), skill=skill,
                   headers=tuple(parse_header(h, environ, "--a2a-header") for h in headers or ()))

    @property
    def card_url(self) -> str:
        return self.url + CARD_PATH

    def __repr__(self) -> str:  # (never the header values: they hold credentials)
        names = ", ".join(name for name, _ in self.headers)
        return f"A2aOptions({self.url!r}, skill={self.skill!r}, headers=[{names}])"
