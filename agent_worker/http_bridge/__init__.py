"""The HTTP bridge: `reach-worker --http URL` serves capabilities with an HTTP agent written in
any language (the request/response contract is agent.py's docstring and the README's).

    agent      HttpAgent, the handler: the request, its headers, what the answer means
    outcome    an answer's outcome: business status first, then the HTTP status (pure)
    stream     answers that stream progress lines (NDJSON, SSE)
    accepted   answers of 202: the outcome by callback (through the gateway) or by polling
    bridge     what a worker's HTTP agents share: one pooled client, readiness, callbacks
    readiness  the readiness probe, and the agent not_ready while it fails
    options    the `--http-*` options (headers with ${ENV} expansion, never logged)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_worker.http_bridge.agent import HttpAgent
    from agent_worker.http_bridge.bridge import HttpBridge, WorkerLink
    from agent_worker.http_bridge.options import BridgeOptions
    from agent_worker.http_bridge.outcome import AgentFailed, interpret

__all__ = ["AgentFailed", "BridgeOptions", "HttpAgent", "HttpBridge", "WorkerLink", "interpret"]

_MODULE_OF = {"HttpAgent": "agent", "HttpBridge": "bridge", "WorkerLink": "bridge",
              "BridgeOptions": "options", "AgentFailed": "outcome", "interpret": "outcome"}


def __getattr__(name: str) -> Any:
    # (Imported when first used: a worker without HTTP agents, and every CLI start that reads
    # the --http options, would otherwise import httpx, 80 ms of each process's start.)
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
