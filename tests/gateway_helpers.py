"""Real gateways and real HTTP agents as processes, and reading what they answer."""

from __future__ import annotations

import json
import shutil
import ssl
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from broker.settings import Settings
from tests.conftest import ROOT, Fleet, Proc, wait_until

NODE_AGENT = ROOT / "examples" / "http-agent" / "agent.js"


def start_gateway(fleet: Fleet, settings: Settings | None = None, *args: str,
                  verify: ssl.SSLContext | bool = True) -> tuple[Proc, str]:
    """`reach serve` on a free loopback port; returns it and its URL once it answers
    (`verify`: what an HTTPS gateway's certificate is checked with)."""
    url_file = fleet.tmp / f"gateway-{len(fleet.procs)}.url"
    proc = fleet.spawn("gateway", [sys.executable, "-m", "reach_cli", "serve", "--addr", "127.0.0.1:0",
                                   "--url-file", str(url_file), "--log-level", "INFO", *args], settings)

    def url() -> str | None:
        if proc.popen.poll() is not None:
            raise AssertionError(f"the gateway exited:\n{proc.output()[-3000:]}")
        text = url_file.read_text().strip() if url_file.exists() else ""
        return text or None

    base = str(wait_until(url, 20, message="the gateway's URL")).replace("0.0.0.0", "127.0.0.1")
    wait_until(lambda: _answers(base, verify), 20, message="the gateway answering")
    return proc, base


def _answers(base: str, verify: ssl.SSLContext | bool = True) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2, verify=verify).status_code in (200, 503)
    except httpx.HTTPError:
        return False


def start_node_agent(fleet: Fleet, port: int = 0) -> tuple[Proc, str]:
    """examples/http-agent/agent.js as a real process; returns it and its base URL."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    proc = fleet.spawn("node-agent", [node, str(NODE_AGENT)], env={"PORT": str(port)})

    def url() -> str | None:
        if proc.popen.poll() is not None:
            raise AssertionError(f"the node agent exited:\n{proc.output()[-3000:]}")
        for line in proc.output().splitlines():
            if line.startswith("listening on "):
                return line.split()[-1]
        return None

    return proc, str(wait_until(url, 20, message="the node agent's URL"))


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of a Server-Sent Events answer (id, event, data parsed as JSON)."""
    event: dict[str, Any] = {}
    data: list[str] = []
    for line in response.iter_lines():
        if not line:
            if data:
                yield {**event, "data": json.loads("\n".join(data))}
            event, data = {}, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            else:
                event[name] = value


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
