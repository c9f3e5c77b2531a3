"""A real redis-server that knows ACL users only (`default` off), optionally with TLS on, for
the tests of broker/acl.py's roles and of TLS (tests/test_acl.py, tests/test_tls.py).

Debian's /usr/bin/redis-server (7.x, built with TLS) is started by the test on a free port in
the test's own directory, with an aclfile holding an `admin` user (for the test's own setup
and reads) and whatever role users the test asks for; nothing else shares it.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from broker.acl import Role, password_hash, rule
from broker.settings import Settings
from tests.conftest import FAST

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
ADMIN_USER = "admin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_or_skip() -> str:
    if not Path(REDIS_SERVER).exists():
        pytest.skip("no redis-server binary on this machine")
    return REDIS_SERVER


@dataclass
class TlsFiles:
    """PEM files of a test CA, the server's certificate and a client's (for mutual TLS)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@dataclass
class AclServer:
    port: int
    directory: Path
    popen: subprocess.Popen[bytes]
    admin_password: str
    tls: TlsFiles | None = None
    passwords: dict[str, str] = field(default_factory=dict)

    def url(self, user: str, password: str, query: str = "") -> str:
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{quote(user)}:{quote(password)}@127.0.0.1:{self.port}/0{query}"

    @property
    def admin_url(self) -> str:
        return self.url(ADMIN_USER, self.admin_password, self.tls_query() if self.tls else "")

    def tls_query(self, *, client_cert: bool = True) -> str:
        assert self.tls is not None
        query = f"?ssl_ca_certs={self.tls.ca}"
        if client_cert:
            query += f"&ssl_certfile={self.tls.client_cert}&ssl_keyfile={self.tls.client_key}"
        return query

    def admin(self) -> Any:
        return redis.Redis.from_url(self.admin_url, decode_responses=True)

    def add_role(self, role: Role, prefix: str, user: str | None = None) -> str:
        """Make the role's user for `prefix` with ACL SETUSER as `reach acl` prints it;
        returns the user's URL."""
        made = rule(role, prefix, user)
        password = secrets.token_urlsafe(16)
        words = made.setuser(password_hash(password)).split()
        assert words[:2] == ["ACL", "SETUSER"]
        admin = self.admin()
        try:
            admin.execute_command(*words)
        finally:
            admin.close()
        self.passwords[made.user] = password
        return self.url(made.user, password, self.tls_query() if self.tls else "")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)

    def log(self) -> str:
        path = self.directory / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_acl_server(directory: Path, users: list[str] = (), *,  # type: ignore[assignment]
                     tls: TlsFiles | None = None, tls_auth_clients: str = "no") -> AclServer:
    """A redis-server whose aclfile holds `admin` and the aclfile lines in `users` only (the
    `default` user is off). With `tls`, it listens with TLS only on its port."""
    binary = redis_server_or_skip()
    directory.mkdir(parents=True, exist_ok=True)
    admin_password = secrets.token_urlsafe(16)
    aclfile = directory / "users.acl"
    lines = ["user default off resetkeys -@all",
             f"user {ADMIN_USER} on #{password_hash(admin_password)} ~* &* +@all", *users]
    aclfile.write_text("\n".join(lines) + "\n")
    port = free_port()
    argv = [binary, "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
            "--appendonly", "no", "--aclfile", str(aclfile), "--logfile", str(directory / "redis.log")]
    if tls is None:
        argv += ["--port", str(port)]
    else:
        argv += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.server_cert),
                 "--tls-key-file", str(tls.server_key), "--tls-ca-cert-file", str(tls.ca),
                 "--tls-auth-clients", tls_auth_clients]
    popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = AclServer(port, directory, popen, admin_password, tls)
    deadline = time.monotonic() + 20
    while True:
        if popen.poll() is not None:
            raise AssertionError(f"redis-server exited ({popen.returncode}):\n{server.log()[-3000:]}")
        with contextlib.suppress(redis.exceptions.ConnectionError, OSError):
            admin = server.admin()
            try:
                if admin.ping():
                    return server
            finally:
                admin.close()
        if time.monotonic() > deadline:
            server.stop()
            raise AssertionError(f"redis-server did not answer:\n{server.log()[-3000:]}")
        time.sleep(0.05)


def role_settings(url: str, prefix: str, **overrides: Any) -> Settings:
    """The fast test settings for a process that connects as the user of `url`."""
    return Settings.load(redis_url=url, prefix=prefix, **{**FAST, **overrides})


def make_tls(directory: Path, *names: str) -> TlsFiles:
    """A fresh test CA (trustme), a server certificate for `names` (default: this host by
    name and address) and a client certificate, as PEM files in `directory`."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*(names or ("localhost", "127.0.0.1")))
    client = ca.issue_cert("reach-client@example.org")
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                     directory / "client.pem", directory / "client.key")
    ca.cert_pem.write_to_path(str(files.ca))
    server.cert_chain_pems[0].write_to_path(str(files.server_cert))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.cert_chain_pems[0].write_to_path(str(files.client_cert))
    client.private_key_pem.write_to_path(str(files.client_key))
    return files
