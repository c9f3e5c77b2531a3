"""`--http URL`: any HTTP agent, in any language, becomes a Reach agent.

The worker POSTs `{"task_id", "capability", "attempt", "trace_id", "session_id", "metadata",
"payload"}` as JSON and expects JSON back with a business `status`:

    {"status": "success", "result": ...}
    {"status": "invalid_request" | "failure" | "retryable_failure", "error": "..."}

HTTP status codes are a fallback when the body has no `status`: 2xx is success (the whole body is
the result), 408/429/502/503/504 are retryable, other 4xx are invalid requests, other 5xx are
failures. Connecting times out after 3 s (retryable); the response may take up to the task's
execution timeout.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any
from urllib.parse import urlsplit

from agent_worker.context import TaskContext
from agent_worker.errors import InvalidRequest, Retryable
from broker import codec

CONNECT_TIMEOUT_S = 3.0
_RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})


class AgentFailed(Exception):
    """The HTTP agent said the task failed (business status `failure`)."""


class HttpAgent:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--http needs an http:// or https:// URL, got {url!r}")
        self.url = url
        self._parts = parts

    def __repr__(self) -> str:
        return f"HttpAgent({self.url!r})"

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        body = codec.dumps({
            "task_id": ctx.task_id, "capability": ctx.capability, "attempt": ctx.attempt,
            "trace_id": ctx.trace_id, "session_id": ctx.session_id, "metadata": ctx.metadata,
            "payload": payload,
        }).encode()
        status, text = await asyncio.to_thread(self._post, body, ctx.timeout_s)
        return interpret(status, text)

    def _post(self, body: bytes, read_timeout: float) -> tuple[int, bytes]:
        p = self._parts
        conn_cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(p.hostname or "", p.port, timeout=CONNECT_TIMEOUT_S)
        try:
            try:
                conn.connect()
            except (TimeoutError, OSError) as exc:
                raise ConnectionError(f"cannot connect to {self.url}: {exc}") from None
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            path = (p.path or "/") + (f"?{p.query}" if p.query else "")
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        except TimeoutError:
            raise TimeoutError(f"{self.url} did not answer within {read_timeout:.0f}s") from None
        finally:
            conn.close()


def interpret(status: int, text: bytes) -> Any:
    """The handler's return value (or exception) for an HTTP agent's reply."""
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("status"), str):
        business = body["status"]
        error = str(body.get("error") or f"agent answered {business}")
        if business == "success":
            return body.get("result")
        if business == "invalid_request":
            raise InvalidRequest(error)
        if business == "retryable_failure":
            raise Retryable(error)
        if business == "failure":
            raise AgentFailed(error)
        raise AgentFailed(f"agent answered an unknown status {business!r}")
    if 200 <= status < 300:
        if body is None and text:
            raise AgentFailed("agent answered 2xx with a body that is not JSON")
        return body
    message = f"agent answered HTTP {status}: {text[:200].decode('utf-8', 'replace')}"
    if status in _RETRYABLE_STATUS:
        raise Retryable(message)
    if 400 <= status < 500:
        raise InvalidRequest(message)
    raise AgentFailed(message)
