"""The MCP server against the official SDK's client (mcp), in real processes: `reach mcp` over
stdio, and over streamable HTTP both on its own and mounted in `reach serve` at /mcp. Tools
list the live capabilities; a call runs a task with progress; failures are tool errors; tools
come and go with the agents."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.apikeys import Role as KeyRole
from gateway.apikeys import create_key, revoke_key
from tests.conftest import ROOT, settings_env, sync_redis, wait_until
from tests.protocol_stack import ECHO, HANDLER, LONG, Stack, protocol_stack

pytestmark = pytest.mark.one_redis


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with protocol_stack(redis_url, tmp_path_factory.mktemp("mcp")) as s:
        url_file = s.fleet.tmp / "mcp.url"
        argv = [sys.executable, "-m", "reach_cli", "mcp", "--transport", "http", "--addr", "127.0.0.1:0",
                "--url-file", str(url_file)]
        proc = s.fleet.spawn("reach-mcp-http", argv)

        def url() -> str | None:
            if proc.popen.poll() is not None:
                raise AssertionError(f"reach mcp exited:\n{proc.output()[-3000:]}")
            return (url_file.read_text().strip() or None) if url_file.exists() else None

        s.urls.append(str(wait_until(url, 20, message="reach mcp's URL")))
        yield s


def stdio(stack: Stack) -> Any:
    """`reach mcp` over stdio, started by the client as MCP hosts do."""
    return stdio_client(StdioServerParameters(command=sys.executable, args=["-m", "reach_cli", "mcp"],
                                              env=settings_env(stack.settings)))


def endpoints(stack: Stack) -> dict[str, Any]:
    return {"stdio": stdio(stack), "gateway": f"{stack.urls[0]}/mcp", "http": f"{stack.urls[1]}/mcp"}



@pytest.fixture(params=["stdio", "gateway", "http"])
def server(request: pytest.FixtureRequest, stack: Stack) -> Any:
    """Where a test's client connects (it opens the client itself: anyio's scopes must close in
    the task that opened them)."""
    return endpoints(stack)[request.param]


class Progress:
    def __init__(self) -> None:
        self.seen: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, total, message))


async def test_tools_are_the_live_capabilities_with_their_schemas(server: Any) -> None:
    async with Client(server, read_timeout_seconds=60) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert {LONG, ECHO} <= set(tools)
    assert tools[LONG].description and tools[LONG].description.startswith("A long task")
    assert tools[LONG].input_schema["properties"]["steps"]["type"] == "integer"
    assert tools[LONG].output_schema is not None and tools[LONG].output_schema["title"] == "LongResult"
    assert tools[ECHO].description == "Answers its payload unchanged"
    assert tools[ECHO].input_schema == {"type": "object", "additionalProperties": True}


async def test_a_long_call_reports_progress_and_answers_the_result(server: Any) -> None:
    """The issue's long task (30 s with progress), here 12 steps of 100 ms."""
    progress = Progress()
    async with Client(server, read_timeout_seconds=60) as client:
        result = await client.call_tool(LONG, {"steps": 12, "step_ms": 100, "echo": "done"},
                                        progress_callback=progress)
    assert not result.is_error
    assert result.structured_content == {"echo": "done", "steps": 12}
    assert [m for _, _, m in progress.seen] == [f"step {i} of 12" for i in range(1, 13)]
    values = [p for p, _, _ in progress.seen]
    assert values == sorted(values) and len(set(values)) == len(values) and values[0] == pytest.approx(1 / 13)
    assert {t for _, t, _ in progress.seen} == {1.0}


async def test_a_failed_task_is_a_tool_error_with_reachs_reason(server: Any) -> None:
    async with Client(server, read_timeout_seconds=60) as client:
        result = await client.call_tool(LONG, {"fail": "out of coffee"})
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "failed" in text and "failure: RuntimeError: out of coffee" in text


async def test_bad_arguments_and_unknown_tools_enqueue_nothing(stack: Stack, server: Any) -> None:
    before = stack.task_records(LONG)
    async with Client(server, read_timeout_seconds=60) as client:
        bad = await client.call_tool(LONG, {"steps": "many"})
        assert bad.is_error and "invalid arguments" in bad.content[0].text  # type: ignore[union-attr]
        extra = await client.call_tool(LONG, {"colour": "red"})
        assert extra.is_error
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("nosuch", {})
    assert stack.task_records(LONG) == before


@pytest.mark.parametrize("where", ["stdio", "gateway"])
async def test_tools_appear_and_disappear_as_agents_come_and_go(stack: Stack, where: str) -> None:
    name = f"late{where}"
    async with Client(endpoints(stack)[where], read_timeout_seconds=60) as client:
        assert name not in {t.name for t in (await client.list_tools()).tools}
        async with client.listen(tools_list_changed=True) as changes:
            worker = stack.fleet.worker(f"{name}={HANDLER}")
            await _next_change(changes, client, lambda names: name in names)
            worker.signal(signal.SIGTERM)  # (it drains and leaves the registry)
            await _next_change(changes, client, lambda names: name not in names)


async def _next_change(changes: Any, client: Client, done: Any) -> None:
    with anyio.fail_after(20):
        async for _ in changes:
            if done({t.name for t in (await client.list_tools()).tools}):
                return


async def test_a_client_of_the_handshake_era_gets_tools_list_changed(stack: Stack) -> None:
    changed = anyio.Event()

    async def handle(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with Client(stdio(stack), mode="legacy", message_handler=handle) as client:
        assert client.server_capabilities.tools is not None and client.server_capabilities.tools.list_changed
        await client.list_tools()
        worker = stack.fleet.worker(f"legacy={HANDLER}")
        with anyio.fail_after(20):
            await changed.wait()
        assert "legacy" in {t.name for t in (await client.list_tools()).tools}
        worker.signal(signal.SIGTERM)


async def test_keys_guard_the_gateways_mcp(stack: Stack) -> None:
    redis = sync_redis(stack.settings.redis_url)
    producer, producer_record = create_key(redis, stack.settings, KeyRole.PRODUCER)
    reader, reader_record = create_key(redis, stack.settings, KeyRole.READER)
    url = f"{stack.urls[0]}/mcp"
    try:
        wait_until(lambda: httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}).status_code
                   == 401, 10, message="the gateway to ask for a key")
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {reader}"}, timeout=30) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            assert LONG in {t.name for t in (await client.list_tools()).tools}
            with pytest.raises(MCPError):  # (the SDK's word for the 403 it met)
                await client.call_tool(ECHO, {"x": 1})
        forbidden = httpx2.post(url, headers={"Authorization": f"Bearer {reader}"}, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": ECHO, "arguments": {}}})
        assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {producer}"}, timeout=30) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            assert (await client.call_tool(ECHO, {"x": 1})).structured_content == {"x": 1}
    finally:
        revoke_key(redis, stack.settings, producer_record.id)
        revoke_key(redis, stack.settings, reader_record.id)
        redis.close()
        wait_until(lambda: httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}).status_code
                   != 401, 10, message="the gateway to forget the keys")


def test_the_example_reaches_summarize_through_mcp_and_a2a(stack: Stack) -> None:
    script = ROOT / "examples" / "agent-protocols" / "summarize_client.py"
    run = subprocess.run([sys.executable, str(script), stack.urls[0]], capture_output=True, text=True,
                         timeout=60, env=settings_env(stack.settings))
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert any(line.startswith("MCP -> Agent-Reach makes every agent") for line in lines), run.stdout
    assert any(line.startswith("A2A -> Agent-Reach makes every agent") for line in lines), run.stdout
    assert "  mcp: scored sentences" in lines and "  a2a: scored sentences" in lines


def test_a_loopback_mcp_refuses_a_foreign_host_or_origin(stack: Stack) -> None:
    """No key is needed on loopback until one is made, so a web page must not reach the tools
    through DNS rebinding: only local Host and Origin headers pass."""
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx2.post(f"{stack.urls[0]}/mcp", json=initialize, headers=accept).status_code == 200
    for foreign in ({"Host": "attacker.example"}, {"Origin": "http://attacker.example"}):
        reply = httpx2.post(f"{stack.urls[0]}/mcp", json=initialize, headers={**accept, **foreign})
        assert reply.status_code in (400, 403, 421), reply.text
