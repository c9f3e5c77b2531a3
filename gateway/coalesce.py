"""One write per response: uvicorn's httptools protocol writes a response's head and its body
with a write each, so a small JSON answer costs two send() system calls and wakes its client
twice. On a loaded 2-core host each of those is tens of microseconds, a good part of what a
submit costs the gateway (issue 25's benchmark, docs/benchmarks.md).

CoalescingProtocol gives uvicorn a transport that holds what is written during one turn of the
event loop and writes it at once at the end of that turn (or before a close): the head and the
body a handler sends together go out as one segment. A streamed response (SSE) loses nothing:
each chunk goes out in the turn it was written. A response's last write goes out as the
response completes, not at the end of the turn: what the handler, uvicorn and the loop do after
it (returning, the task's end, the keep-alive timer) would otherwise keep the client waiting.
(uvloop before 0.23 holds every write to the end of the turn itself.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport that writes, once per turn of the loop, what was written during it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(bytes(data))

    def flush(self) -> None:
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held = []
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)  # (the rest is the transport's own)


class CoalescingProtocol(HttpToolsProtocol):
    _held: CoalescingTransport

    def connection_made(self, transport: Any) -> None:
        # (uvloop's transports are not asyncio.Transport instances, but behave as one)
        self._held = CoalescingTransport(transport, asyncio.get_running_loop())
        wrapped: Any = self._held
        super().connection_made(wrapped)

    def on_response_complete(self) -> None:
        self._held.flush()  # (uvicorn calls this right after the response's last write)
        super().on_response_complete()
