"""How the worker talks to its HTTP agents (`reach-worker --http URL` and its `--http-*` options).

Header values may name environment variables (`Authorization: Bearer ${AGENT_TOKEN}`), expanded
once at start; a variable that is not set is an error naming it. Values are never logged: only
header names are ever shown.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from broker.errors import ConfigError

CONNECT_TIMEOUT_S = 3.0
"""Connecting to an agent gives up after this long (a retryable failure)."""
PROBE_TIMEOUT_S = 2.0
"""A readiness probe gives up after this long (the agent is not ready)."""
POLL_AFTER_S = 5.0
"""With a callback URL, how long an accepted task's callback is awaited before its status_url is
polled as well."""
POLL_FIRST_S = 1.0
POLL_MAX_S = 30.0

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_RESERVED = ("content-type", "content-length", "host", "x-reach-")


def expand(value: str, environ: dict[str, str] | None = None) -> str:
    """`${NAME}` replaced by that environment variable (ConfigError naming a missing one)."""
    env = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"--http-header refers to ${{{name}}}, which is not set in the environment")
        return env[name]

    return _VAR.sub(one, value)


def parse_header(spec: str, environ: dict[str, str] | None = None,
                 flag: str = "--http-header") -> tuple[str, str]:
    """`Name: value` (value expanded) as (name, value); `flag` names the option in errors."""
    name, sep, value = spec.partition(":")
    name = name.strip()
    if not sep or not _NAME.match(name):
        raise ConfigError(f"{flag} must look like 'Name: value', got a header named {name[:40]!r}")
    if name.lower().startswith(_RESERVED):
        raise ConfigError(f"{flag} {name}: the bridge sets this header itself")
    value = expand(value.strip(), environ)
    if any(c in value for c in "\r\n\0"):
        raise ConfigError(f"{flag} {name}: its value holds a line break")
    return name, value


def check_url(url: str, what: str = "--http") -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} needs an http:// or https:// URL, got {url!r}")
    return url


def ready_url(spec: str, agent_url: str) -> str:
    """`--http-ready`: a URL, or `auto` for `/ready` at the agent's origin."""
    if spec == "auto":
        parts = urlsplit(agent_url)
        return urlunsplit((parts.scheme, parts.netloc, "/ready", "", ""))
    return check_url(spec, "--http-ready")


@dataclass(frozen=True)
class BridgeOptions:
    headers: tuple[tuple[str, str], ...] = ()
    """User headers (expanded) sent with every task call."""
    ready: str | None = None
    """`--http-ready`: a URL, `auto`, or None (then only whether the agent accepts connections)."""
    callback_url: str | None = None
    """The gateway's base URL, where an agent that answered 202 posts the outcome."""
    poll_after_s: float = POLL_AFTER_S

    @classmethod
    def build(cls, headers: list[str] | None = None, ready: str | None = None,
              callback_url: str | None = None, poll_after_s: float = POLL_AFTER_S,
              environ: dict[str, str] | None = None) -> BridgeOptions:
        if ready is not None and ready != "auto":
            check_url(ready, "--http-ready")
        if callback_url is not None:
            callback_url = check_url(callback_url, "--http-callback-url").rstrip("/")
        return cls(headers=tuple(parse_header(h, environ) for h in headers or ()), ready=ready,
                   callback_url=callback_url, poll_after_s=poll_after_s)

    def __repr__(self) -> str:  # (never the values: they hold credentials)
        names = ", ".join(name for name, _ in self.headers)
        return f"BridgeOptions(headers=[{names}], ready={self.ready!r}, callback_url={self.callback_url!r})"
