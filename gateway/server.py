"""Serving the gateway with uvicorn (`reach serve`): where it listens and who may call it.

On a loopback address API keys are optional until the first one is made; on any other address
the gateway refuses to start without a key unless told `--insecure-no-auth`. It binds its socket
itself, so `--addr 127.0.0.1:0` takes a free port, and it prints the URL it listens on.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

import uvicorn

from broker.errors import ConfigError
from broker.infra import connection
from broker.settings import Settings
from gateway.addresses import DEFAULT_ADDR, is_loopback, parse_addr
from gateway.apikeys import AuthMode, list_keys
from gateway.app import create_app

log = logging.getLogger("reach.gateway")


def auth_mode(settings: Settings, host: str, insecure_no_auth: bool) -> AuthMode:
    """How requests are checked; ConfigError when a non-loopback gateway would be open."""
    if insecure_no_auth:
        return AuthMode.OFF
    if is_loopback(host):
        return AuthMode.AUTO
    client = connection.sync_client(settings)
    try:
        if not list_keys(client, settings):
            raise ConfigError(f"refusing to serve on {host} (not a loopback address) with no API key: "
                              "make one with `reach keys create --role producer`, or pass "
                              "--insecure-no-auth")
    finally:
        client.close()
    return AuthMode.REQUIRED


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def check_tls(cert: Path | None, key: Path | None) -> dict[str, Any]:
    """uvicorn's TLS options for HTTPS (none: plain HTTP); a ConfigError naming what is wrong
    with the files, before the server starts (uvicorn's own error is a traceback)."""
    if cert is None and key is None:
        return {}
    if cert is None or key is None:
        raise ConfigError("HTTPS needs both --tls-cert and --tls-key")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot use the TLS certificate {cert} with key {key}: {exc}") from None
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def serve(settings: Settings, addr: str = DEFAULT_ADDR, *, insecure_no_auth: bool = False,
          access_log: bool = False, log_level: str = "info", url_file: Path | None = None,
          tls_cert: Path | None = None, tls_key: Path | None = None) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's own handling: in-flight requests finish); HTTPS
    with `tls_cert` and `tls_key` (PEM files)."""
    host, port = parse_addr(addr)
    tls = check_tls(tls_cert, tls_key)
    mode = auth_mode(settings, host, insecure_no_auth)
    sock = bind(host, port)
    url = url_of(sock, "https" if tls else "http")
    config = uvicorn.Config(create_app(settings, mode), log_level=log_level, access_log=access_log,
                            loop=_best("uvloop", "auto"), http=_http_protocol(),
                            lifespan="on", timeout_graceful_shutdown=5, server_header=False, **tls)
    server = uvicorn.Server(config)
    if mode is AuthMode.OFF:
        log.warning("serving with no authentication (--insecure-no-auth)")
    print(f"reach gateway listening on {url} (API keys: {mode.value})", flush=True)
    if url_file is not None:
        url_file.write_text(url + "\n")
    server.run(sockets=[sock])
    sys.stdout.flush()


def _http_protocol() -> type[asyncio.Protocol] | str:
    """httptools' parser with one write per response (gateway/coalesce.py), where it builds."""
    try:
        from gateway.coalesce import CoalescingProtocol
    except ImportError:
        return "auto"
    return CoalescingProtocol


def _best(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module
