"""`--http URL`: any HTTP agent, in any language, becomes a Reach agent.

For each attempt the worker POSTs JSON

    {"task_id", "capability", "attempt", "trace_id", "session_id", "metadata", "payload"}

with the headers X-Reach-Task-Id, X-Reach-Attempt, X-Reach-Deadline (when this attempt must
end, RFC 3339 UTC), X-Reach-Trace-Id, the attempt's W3C `traceparent` (and `tracestate`: see
TaskContext.traceparent), the user's `--http-header`s and, when the worker has a callback URL,
X-Reach-Callback-Url and X-Reach-Callback-Token. The agent answers

- JSON: the outcome (outcome.py: its business `status` first, else the HTTP status);
- `application/x-ndjson` or `text/event-stream`: progress lines, then the outcome (stream.py);
- 202 `{"accepted": true, "status_url": "..."}`: it works on; the outcome comes by callback or
  from polling `status_url` (accepted.py).

Connecting gives up after 3 s (retryable); the whole answer is bounded by the attempt's
execution timeout, and a cancelled or timed-out attempt closes its request.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx

from agent_worker.context import TaskContext
from agent_worker.http_bridge.accepted import await_outcome
from agent_worker.http_bridge.options import BridgeOptions, check_url
from agent_worker.http_bridge.outcome import AgentFailed, interpret, is_business, parse_json
from agent_worker.http_bridge.stream import is_stream, read_bounded, read_stream
from broker import codec

if TYPE_CHECKING:
    from agent_worker.http_bridge.bridge import HttpBridge

ENVELOPE_BYTES = 65536
"""Room for what surrounds a result in an answer (its status, error, progress fields)."""
ACCEPT = "application/json, application/x-ndjson, text/event-stream"


def trace_headers(ctx: TaskContext) -> dict[str, str]:
    """The attempt's W3C trace context, for the agent to continue the trace."""
    if not ctx.traceparent:
        return {}
    if ctx.tracestate:
        return {"traceparent": ctx.traceparent, "tracestate": ctx.tracestate}
    return {"traceparent": ctx.traceparent}


class HttpAgent:
    def __init__(self, url: str, options: BridgeOptions | None = None) -> None:
        self.url = check_url(url)
        self.options = options or BridgeOptions()
        self._bridge: HttpBridge | None = None

    def __repr__(self) -> str:
        return f"HttpAgent({self.url!r})"

    def attach(self, bridge: HttpBridge) -> None:
        """Use the worker's shared client, readiness and callbacks (done by the worker)."""
        self._bridge = bridge

    @property
    def bridge(self) -> HttpBridge:
        if self._bridge is None:
            raise RuntimeError("an HttpAgent runs inside a worker (Worker attaches its HttpBridge)")
        return self._bridge

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        bridge = self.bridge
        attempt = bridge.link.running.current(ctx)
        fence = attempt.lease.fence if attempt is not None else ""
        headers = self._headers(ctx)
        armed = False
        if self.options.callback_url and fence:
            ttl_ms = round(ctx.timeout_s * 1000) + bridge.link.settings.lease_ms + 60_000
            token = await bridge.arm_callback(ctx.task_id, fence, ttl_ms)
            if token is not None:
                headers["X-Reach-Callback-Url"] = f"{self.options.callback_url}/v1/callbacks/{ctx.task_id}"
                headers["X-Reach-Callback-Token"] = token
                armed = True
        body = codec.dumps({
            "task_id": ctx.task_id, "capability": ctx.capability, "attempt": ctx.attempt,
            "trace_id": ctx.trace_id, "session_id": ctx.session_id, "metadata": ctx.metadata,
            "payload": payload,
        }).encode()
        limit = bridge.link.settings.max_result_bytes + ENVELOPE_BYTES
        timeout = httpx.Timeout(ctx.timeout_s, connect=3.0)
        try:
            async with bridge.client.stream("POST", self.url, content=body, headers=headers,
                                            timeout=timeout) as response:
                if is_stream(response):
                    return await read_stream(response, ctx, limit)
                text = await read_bounded(response, limit)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            bridge.readiness.check_soon()
            raise ConnectionError(f"cannot connect to {self.url}: {exc}") from None
        except httpx.TimeoutException:
            raise TimeoutError(f"{self.url} did not answer within {ctx.timeout_s:g}s") from None
        except httpx.HTTPError as exc:  # (the connection broke mid-answer: a transient fault)
            raise ConnectionError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 202:
            accepted = parse_json(text)
            if not is_business(accepted):
                return await await_outcome(bridge, ctx, fence, accepted, armed,
                                           self.options.poll_after_s, limit)
        return interpret(response.status_code, text, response.headers)

    def _headers(self, ctx: TaskContext) -> dict[str, str]:
        ends = time.time() + ctx.timeout_s
        if ctx.deadline is not None:
            ends = min(ends, ctx.deadline.timestamp())
        deadline = datetime.fromtimestamp(ends, UTC).isoformat(timespec="milliseconds")
        return {
            **dict(self.options.headers),
            "Content-Type": "application/json",
            "Accept": ACCEPT,
            "X-Reach-Task-Id": ctx.task_id,
            "X-Reach-Attempt": str(ctx.attempt),
            "X-Reach-Deadline": deadline.replace("+00:00", "Z"),
            "X-Reach-Trace-Id": ctx.trace_id,
            **trace_headers(ctx),
        }


__all__ = ["AgentFailed", "HttpAgent"]
