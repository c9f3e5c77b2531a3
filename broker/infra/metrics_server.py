"""One small HTTP server per process, on its own threads (never the event loop's): `/metrics`
(Prometheus text, from the process's registry), `/healthz` (the process and its loops are
alive) and `/readyz` (it can do its work now). Each check answers JSON, 200 when it passes and
503 when not, with what was checked.

A check runs on a request's thread: one that reads Redis uses a client of its own with a short
timeout, so a probe never waits on (or stalls) the event loop.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from broker.infra import connection
from broker.settings import Settings

log = logging.getLogger("reach.metrics")

Check = Callable[[], dict[str, Any]]
"""A probe: what it checked, name -> value; it passes when every value is true (a check whose
value is a number or text is information only, when its name starts with '_')."""

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def passes(checks: dict[str, Any]) -> bool:
    return all(bool(value) for name, value in checks.items() if not name.startswith("_"))


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer:
    """Serves a registry and two probes on (host, port) until stopped."""

    def __init__(self, registry: CollectorRegistry, healthz: Check, readyz: Check) -> None:
        self._metrics = make_wsgi_app(registry)
        self._probes = {"/healthz": healthz, "/readyz": readyz}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self, host: str, port: int) -> int:
        """Listen (OSError when the address cannot be had); returns the port (port 0: a free one)."""
        server_class = _Server6 if ":" in host else _Server
        server = make_server(host, port, self._app, server_class=server_class,
                             handler_class=_QuietHandler)
        self._server = server
        self.port = int(server.server_address[1])
        # (its poll: how long stop() waits; an idle poll is a select() call)
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="reach-metrics", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _json(start_response, "405 Method Not Allowed", {"error": f"{method} not allowed"},
                         [("Allow", "GET, HEAD")])
        if path == "/metrics":
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        probe = self._probes.get(path)
        if probe is None:
            return _json(start_response, "404 Not Found",
                         {"error": f"no such path {path[:100]!r}; try /metrics, /healthz, /readyz"})
        try:
            checks = probe()
        except Exception as exc:  # (a probe must answer, whatever broke)
            checks = {"probe": False, "_error": f"{type(exc).__name__}: {exc}"[:300]}
        ok = passes(checks)
        return _json(start_response, "200 OK" if ok else "503 Service Unavailable",
                     {"status": "ok" if ok else "failing", "checks": checks})


def _json(start_response: StartResponse, status: str, body: dict[str, Any],
          headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    data = json.dumps(body, default=str).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                            ("Cache-Control", "no-store"), *(headers or [])])
    return [data]


def serve(registry: CollectorRegistry, healthz: Check, readyz: Check, address: tuple[str, int],
          what: str) -> MetricsServer:
    """Start the server on `address` and log where it listens (the port 0 picked)."""
    server = MetricsServer(registry, healthz, readyz)
    host, _ = address
    port = server.start(*address)
    shown = f"[{host}]" if ":" in host else host
    log.info("%s metrics on http://%s:%d/metrics (health: /healthz, /readyz)", what, shown, port)
    return server


class RedisProbe:
    """Whether Redis answers a PING now, asked from a probe's thread on a client of its own."""

    def __init__(self, settings: Settings, timeout_s: float = 1.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            try:
                if self._client is None:
                    self._client = connection.sync_client(self.settings, socket_timeout=self.timeout_s)
                return bool(self._client.ping())
            except Exception as exc:  # (any failure means: not connected now)
                log.debug("Redis probe failed: %s", exc)
                if self._client is not None:
                    self._client.close()
                    self._client = None
                return False
