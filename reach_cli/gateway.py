"""`reach serve` (the HTTP gateway), `reach mcp` (the MCP server alone) and
`reach keys create|list|revoke` (the gateway's API keys)."""

import asyncio
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gateway.addresses import DEFAULT_ADDR
from gateway.apikeys import create_key, list_keys, parse_role, revoke_key
from reach_cli.common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    console,
    fail,
    load_settings,
    print_json,
    read_redis,
    setup_logging,
)

keys_app = typer.Typer(no_args_is_help=True, help="The gateway's API keys (only their hashes are stored).")


@cli_errors
def serve(
    addr: Annotated[str, typer.Option(help="host:port to listen on (port 0: a free one)")] = DEFAULT_ADDR,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="Serve a non-loopback address with no API key (anyone may call)")] = False,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request")] = False,
    url_file: Annotated[Path | None, typer.Option(help="Also write the URL it listens on here")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="Serve HTTPS with this certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The certificate's private key (PEM)")] = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Serve the HTTP gateway: the API for producers in any language, and HTTP agents' callbacks."""
    from gateway.server import serve as run_gateway

    setup_logging(log_level)
    run_gateway(load_settings(config, redis_url), addr, insecure_no_auth=insecure_no_auth,
                access_log=access_log, log_level=log_level.lower(), url_file=url_file,
                tls_cert=tls_cert, tls_key=tls_key)


class Transport(StrEnum):
    STDIO = "stdio"
    HTTP = "http"


MCP_ADDR = "127.0.0.1:8081"


@cli_errors
def mcp(
    transport: Annotated[Transport, typer.Option(
        help="stdio (what MCP hosts start) or http")] = Transport.STDIO,
    addr: Annotated[str, typer.Option(
        help="With --transport http: host:port (port 0: a free one)")] = MCP_ADDR,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="HTTP on a non-loopback address with no API key")] = False,
    url_file: Annotated[Path | None, typer.Option(
        help="With http: also write the URL it listens on here")] = None,
    log_level: Annotated[str, typer.Option()] = "WARNING",
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Serve every live capability as an MCP tool (a call runs a task and answers its result).
    The gateway (`reach serve`) serves the same at <URL>/mcp."""
    from gateway.protocols import installed

    if not installed("mcp"):
        fail("reach mcp needs the mcp extra: pip install 'agent-reach[mcp]'", EXIT_USAGE)
    from gateway.mcp.serve import serve_http, serve_stdio

    setup_logging(log_level)  # (on stderr: over stdio, stdout is the protocol's)
    settings = load_settings(config, redis_url)
    if transport is Transport.STDIO:
        asyncio.run(serve_stdio(settings))
    else:
        serve_http(settings, addr, insecure_no_auth=insecure_no_auth, log_level=log_level.lower(),
                   url_file=url_file)


@keys_app.command("create")
@cli_errors
def keys_create(
    role: Annotated[str, typer.Option(help="reader, producer or operator")],
    name: Annotated[str, typer.Option(help="What the key is for (shown by `keys list`)")] = "",
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Make an API key and print it (it is shown only this once)."""
    chosen = parse_role(role)
    settings = load_settings(config, redis_url)
    key, record = read_redis(settings, lambda client: create_key(client, settings, chosen, name))
    if as_json:
        print_json({**record.as_dict(), "key": key})
        return
    typer.echo(key)
    typer.echo(f"(id {record.id}, role {record.role.value}: keep the key now, it is not stored)", err=True)


@keys_app.command("list")
@cli_errors
def keys_list(as_json: JsonOption = False, redis_url: RedisUrlOption = None,
              config: ConfigOption = None) -> None:
    """List the API keys (their ids, names and roles; never the keys)."""
    settings = load_settings(config, redis_url)
    records = read_redis(settings, lambda client: list_keys(client, settings))
    if as_json:
        print_json([r.as_dict() for r in records])
        return
    table = Table(title=f"API keys ({len(records)})")
    for column in ("id", "role", "name", "created"):
        table.add_column(column)
    for r in records:
        table.add_row(r.id, r.role.value, r.name or "-", r.created_at)
    console.print(table)


@keys_app.command("revoke")
@cli_errors
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id, as `keys list` shows it")],
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Revoke an API key (gateways stop accepting it within a second)."""
    settings = load_settings(config, redis_url)
    revoked = read_redis(settings, lambda client: revoke_key(client, settings, key_id))
    if as_json:
        print_json({"id": key_id, "revoked": revoked})
    if not revoked:
        fail(f"no API key with id {key_id!r}", EXIT_RUNTIME)
    if not as_json:
        typer.echo(f"key {key_id} revoked")
