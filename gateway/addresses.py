"""Where a gateway listens (`--addr`), and whether that is a loopback address (pure)."""

from __future__ import annotations

import ipaddress

from broker.errors import ConfigError

DEFAULT_ADDR = "127.0.0.1:8080"


def parse_addr(addr: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (all interfaces)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--addr {addr!r}: expected host:port, e.g. {DEFAULT_ADDR}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
