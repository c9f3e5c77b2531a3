"""TLS to Redis (`rediss://`, the tls_* settings) against Debian's redis-server with TLS on,
with certificates the test makes (trustme): the server verified with a CA, its host name
checked, mutual TLS, a clear error for a certificate that is not trusted, the spine through
TLS with real processes; and the gateway serving HTTPS (`reach serve --tls-cert --tls-key`)."""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from broker import BrokerUnavailable, ConfigError, ReachClient
from broker.acl import Role
from broker.infra import connection, outages
from broker.settings import Settings
from tests.acl_helpers import (
    ADMIN_USER,
    AclServer,
    TlsFiles,
    free_port,
    make_tls,
    redis_server_or_skip,
    role_settings,
    start_acl_server,
)
from tests.conftest import ROOT, Fleet, settings_env, wait_until
from tests.gateway_helpers import start_gateway


def _tls_built_in() -> bool:
    """Whether this redis-server was built with TLS (it refuses --tls-port otherwise)."""
    binary = redis_server_or_skip()
    probe = subprocess.run([binary, "--port", "0", "--tls-port", "1", "--test-memory", "0"],
                           capture_output=True, text=True, timeout=20)
    return "not built with TLS" not in probe.stdout + probe.stderr


needs_tls = pytest.mark.skipif(not Path("/usr/bin/redis-server").exists() or not _tls_built_in(),
                               reason="this redis-server was not built with TLS")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def mutual(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    """A redis-server with TLS only, that asks every client for a certificate its CA signed."""
    server = start_acl_server(tmp_path_factory.mktemp("tls-redis"), tls=tls, tls_auth_clients="yes")
    yield server
    server.stop()


def plain_url(server: AclServer, query: str = "") -> str:
    return server.url(ADMIN_USER, server.admin_password, query)


def ping(settings: Settings) -> bool:
    """PING through the connection module, a failure as the error callers see."""
    client = connection.sync_client(settings)
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError as exc:
        raise outages.unavailable(exc, settings) from exc
    finally:
        client.close()


@needs_tls
def test_server_verified_with_the_ca_and_mutual_tls(mutual: AclServer, tls: TlsFiles) -> None:
    # The CA and the client certificate from the settings...
    assert ping(Settings.load(redis_url=plain_url(mutual), tls_ca_file=str(tls.ca),
                              tls_cert_file=str(tls.client_cert), tls_key_file=str(tls.client_key)))
    # ...or from the URL's parameters.
    assert ping(Settings.load(redis_url=plain_url(mutual, mutual.tls_query())))
    # No client certificate: the server refuses the handshake.
    with pytest.raises(BrokerUnavailable):
        ping(Settings.load(redis_url=plain_url(mutual), tls_ca_file=str(tls.ca)))


@needs_tls
def test_an_untrusted_certificate_is_a_clear_error(mutual: AclServer, tmp_path: Path) -> None:
    stranger = make_tls(tmp_path / "other-ca")
    for settings in (
        Settings.load(redis_url=plain_url(mutual), tls_ca_file=str(stranger.ca),
                      tls_cert_file=str(stranger.client_cert), tls_key_file=str(stranger.client_key)),
        Settings.load(redis_url=plain_url(mutual)),  # (the system's CAs do not know the test CA)
    ):
        with pytest.raises(BrokerUnavailable, match="TLS certificate is not trusted: point tls_ca_file"):
            ping(settings)
        with ReachClient(settings) as client, pytest.raises(BrokerUnavailable, match="not trusted"):
            client.submit("echo", {"n": 1})


@needs_tls
def test_the_host_name_is_checked(tmp_path: Path) -> None:
    # (Not start_acl_server: its own admin ping would fail the same check.)
    wrong = make_tls(tmp_path / "certs", "redis.other.example")
    binary = redis_server_or_skip()
    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(port),
                             "--tls-cert-file", str(wrong.server_cert),
                             "--tls-key-file", str(wrong.server_key),
                             "--tls-ca-cert-file", str(wrong.ca), "--tls-auth-clients", "no",
                             "--save", "", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"rediss://127.0.0.1:{port}/0"
        # (The certificate is trusted and names redis.other.example, not 127.0.0.1: refused.)
        refused = Settings.load(redis_url=url, tls_ca_file=str(wrong.ca))

        def refused_for_the_name() -> bool:
            try:
                ping(refused)
            except BrokerUnavailable as exc:
                return "not for this host name" in str(exc)
            raise AssertionError("a certificate for another host name was accepted")

        assert wait_until(refused_for_the_name, 20, interval=0.1, message="the hostname refusal")
        # Without the host name check (a URL parameter) the same server is reached.
        assert ping(Settings.load(redis_url=f"{url}?ssl_check_hostname=false", tls_ca_file=str(wrong.ca)))
    finally:
        proc.terminate()
        proc.wait(10)


def test_tls_settings_need_files_and_a_rediss_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tls_ca_file: .*no such file"):
        Settings.load(redis_url="rediss://127.0.0.1:1/0", tls_ca_file=str(tmp_path / "missing.pem"))
    (tmp_path / "ca.pem").write_text("x")
    plain = Settings.load(redis_url="redis://127.0.0.1:1/0", tls_ca_file=str(tmp_path / "ca.pem"))
    with pytest.raises(ConfigError, match="need a rediss:// URL"):
        connection.sync_client(plain)


@needs_tls
def test_spine_through_mutual_tls_under_acl_roles(mutual: AclServer, tls: TlsFiles, tmp_path: Path) -> None:
    prefix = "ttls"
    files = {"tls_ca_file": str(tls.ca), "tls_cert_file": str(tls.client_cert),
             "tls_key_file": str(tls.client_key)}

    def as_role(role: Role) -> Settings:
        # (The user's URL without the TLS parameters: the settings carry the files.)
        url = mutual.add_role(role, prefix).split("?", 1)[0]
        return role_settings(url, prefix, **files)

    agent = as_role(Role.AGENT)
    admin = mutual.admin()
    admin.execute_command("ACL", "SETUSER", f"{prefix}-agent", f"~{prefix}:test:*")
    fleet = Fleet(agent, tmp_path)
    try:
        fleet.dispatcher(settings=as_role(Role.DISPATCHER))
        worker = fleet.worker("echo", handler="tests.handlers:record", wait=False)
        fleet.wait_healthy(str(worker.agent_id), role_settings(mutual.admin_url, prefix), worker)
        with ReachClient(as_role(Role.PRODUCER)) as client:
            assert client.submit("echo", {"n": "tls"}).result(timeout=60) == {"n": "tls"}
        assert "rediss://" in fleet.procs[0].output() and "tls_key" not in fleet.procs[0].output().lower()
    finally:
        fleet.stop_all()
        for key in admin.scan_iter(match=f"{prefix}:*"):
            admin.unlink(key)
        admin.close()


@needs_tls
def test_gateway_serves_https_over_tls_to_redis(mutual: AclServer, tls: TlsFiles, tmp_path: Path) -> None:
    settings = role_settings(mutual.admin_url, "tgw")
    trusting = ssl.create_default_context(cafile=str(tls.ca))
    fleet = Fleet(settings, tmp_path)
    try:
        _, base = start_gateway(fleet, settings, "--tls-cert", str(tls.server_cert),
                                "--tls-key", str(tls.server_key), verify=trusting)
        assert base.startswith("https://")
        with httpx.Client(base_url=base, verify=trusting, timeout=30) as http:
            assert http.get("/healthz").status_code == 200
            assert http.get("/v1/queues").status_code == 200
        with pytest.raises(httpx.ConnectError):  # (a client that does not trust the CA)
            httpx.get(f"{base}/healthz", timeout=10)
    finally:
        fleet.stop_all()
    broken = subprocess.run([sys.executable, "-m", "reach_cli", "serve", "--addr", "127.0.0.1:0",
                             "--tls-cert", str(tls.ca), "--tls-key", str(tmp_path / "missing.key")],
                            capture_output=True, text=True, env=settings_env(settings), cwd=ROOT, timeout=60)
    assert broken.returncode == 2 and "cannot use the TLS certificate" in broken.stderr
    half = subprocess.run([sys.executable, "-m", "reach_cli", "serve", "--tls-cert", str(tls.server_cert)],
                          capture_output=True, text=True, env=settings_env(settings), cwd=ROOT, timeout=60)
    assert half.returncode == 2 and "both --tls-cert and --tls-key" in half.stderr
