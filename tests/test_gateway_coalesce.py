"""The gateway's transport (gateway/coalesce.py): a response's head and body leave in one write,
and that write happens as the response completes, not after what the handler does next.

A real uvicorn server in a thread and a real client socket. The app blocks its event loop
(time.sleep) at the moments that tell the two apart, and records when: a write made at the end
of the loop's turn could only reach the client after that sleep.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from gateway.coalesce import CoalescingProtocol
from tests.conftest import wait_until

HOLD_S = 0.3
BODY = b'{"ok":true}'


class App:
    """Sends the head, blocks, sends the body, blocks again; notes the times."""

    def __init__(self) -> None:
        self.body_sent_at = 0.0
        self.done_at = 0.0
        self.done = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(BODY)).encode()),
                                (b"content-type", b"application/json")]})
        time.sleep(HOLD_S)  # (blocks the loop: nothing written can leave meanwhile but by a write)
        self.body_sent_at = time.monotonic()
        await send({"type": "http.response.body", "body": BODY})
        time.sleep(HOLD_S)
        self.done_at = time.monotonic()
        self.done.set()


@pytest.fixture(params=["asyncio", "uvloop"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[App, int]]:
    loop = request.param
    if loop == "uvloop":
        pytest.importorskip("uvloop", minversion="0.23",
                            reason="uvloop before 0.23 holds writes to the turn's end itself")
    app = App()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    config = uvicorn.Config(app, http=CoalescingProtocol, log_level="warning", lifespan="off", loop=loop)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, message="the server to start")
    try:
        yield app, sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_head_and_body_leave_together_as_the_response_completes(served: tuple[App, int]) -> None:
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = client.recv(65536)
        first_at = time.monotonic()
        data = first
        while not data.endswith(BODY):
            data += client.recv(65536)
    # The head was held until the body came: the first bytes arrived after the body was sent,
    # and they held the body too.
    assert first_at >= app.body_sent_at
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(BODY)
    # ...and left with the body's send, while the app still ran (its loop was blocked after).
    assert app.done.wait(10), "the app did not finish"
    assert first_at < app.done_at
