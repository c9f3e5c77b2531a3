"""The gateway figures' client: one keep-alive HTTP/1.1 connection on a plain socket, a request
at a time (what a producer in another language that reuses its connection does).

Not httpx: on the benchmark's two shared cores httpx spends about as much CPU per request as
the gateway does to serve it, so the figure would be the client's. This one builds a request
with one format and reads the answer's status line, Content-Length and body, and nothing else;
the gateway's JSON answers always carry a Content-Length (an answer without one is refused).
"""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

from bench.procs import ProcessFailed

_READ = 65536


class KeepAlive:
    def __init__(self, url: str, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        self.host = parts.netloc
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KeepAlive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def post_json(self, path: str, value: Any) -> tuple[int, bytes]:
        body = json.dumps(value, separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        return self._exchange(head + body)

    def get(self, path: str) -> tuple[int, bytes]:
        return self._exchange(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        lines = self.buf[:end].split(b"\r\n")
        rest = self.buf[end + 4:]
        status = int(lines[0].split(b" ", 2)[1])
        length = -1
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length < 0:
            raise ProcessFailed(f"the gateway answered {status} without a Content-Length")
        self.buf = rest
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body

    def _fill(self) -> None:
        chunk = self.sock.recv(_READ)
        if not chunk:
            raise ProcessFailed("the gateway closed the connection")
        self.buf += chunk
