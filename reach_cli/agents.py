"""`reach agents`: list the fleet's agents; `revoke` one; `secret set|clear|status` for the
fleet's join secret."""

import asyncio
import getpass
import os
import secrets
import socket
import sys
from typing import Annotated

import typer
from rich.table import Table

from broker import identity
from broker.ids import check_capability
from broker.infra import connection, eventloop, outages
from broker.keys import RegistryKeys
from broker.ops.overview import AgentRow, agent_rows
from broker.ops.revoke import RevokeResult, revoke_agent
from broker.registry import clock_of
from broker.scripts import AsyncScripts
from broker.settings import Settings
from reach_cli.common import (
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
)

app = typer.Typer(invoke_without_command=True, help="The fleet's agents: list them, revoke one, "
                  "set the join secret.")
secret_app = typer.Typer(no_args_is_help=True, help="The fleet's join secret (only a verifier of it "
                         "is stored).")
app.add_typer(secret_app, name="secret")

_STATE_STYLE = {"healthy": "green", "warming": "cyan", "suspect": "yellow", "offline": "red",
                "draining": "magenta", "not_ready": "yellow"}


@app.callback()
@cli_errors
def agents(
    ctx: typer.Context,
    capability: Annotated[str | None, typer.Option(help="Only agents serving this capability")] = None,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """List agents: state, region, version, in-flight/max, heartbeat age, backlog, success rate,
    and registrations of their id the registry refused."""
    if ctx.invoked_subcommand is not None:
        return
    if capability:
        check_capability(capability)
    settings = load_settings(config, redis_url)
    rows = read_redis(settings, lambda client: agent_rows(client, settings, capability))
    if as_json:
        print_json([row.as_dict() for row in rows])
        return
    table = Table(title=f"Agents ({len(rows)})")
    for column in ("agent", "state", "capabilities", "region", "version", "inflight/max",
                   "heartbeat", "backlog", "success", "p50 ms", "refused"):
        table.add_column(column)
    for row in rows:
        style = _STATE_STYLE.get(row.state, "")
        state = f"{row.state} (revoked)" if row.revoked else row.state
        table.add_row(
            row.agent_id, f"[{style}]{state}[/{style}]", ",".join(row.capabilities),
            row.region or "-", row.version or "-", f"{row.inflight}/{row.max_concurrency}",
            f"{row.last_heartbeat_age_s:.1f}s ago", str(row.backlog),
            f"{row.success_rate:.1%}" if row.success_rate is not None else "-",
            f"{row.latency_p50_ms:.0f}" if row.latency_p50_ms is not None else "-",
            _refusals(row),
        )
    console.print(table)


def _refusals(row: AgentRow) -> str:
    if not row.registrations_refused:
        return "-"
    return f"{row.registrations_refused} ({row.last_refusal}, {row.last_refusal_age_s:.0f}s ago)"


@app.command("revoke")
@cli_errors
def revoke(
    agent_id: Annotated[str, typer.Argument(help="The agent's id, as `reach agents` shows it")],
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Revoke an agent's token at once: it goes offline, its tasks go to other agents now, its
    process stops and its old token never registers again. (To keep its host out, rotate the
    join secret too.)"""
    settings = load_settings(config, redis_url)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    with asyncio.Runner(loop_factory=eventloop.loop_factory()) as runner:
        result = runner.run(_revoke(settings, agent_id, who))
    if as_json:
        print_json(result.as_dict())
        return
    released, reclaimed = sum(result.released.values()), sum(result.reclaimed.values())
    again = " (it was revoked already)" if result.already else ""
    typer.echo(f"agent {agent_id} revoked{again}: {released} unread and {reclaimed} held task(s) "
               "handed to other agents")


async def _revoke(settings: Settings, agent_id: str, who: str) -> RevokeResult:
    client = connection.async_client(settings)
    try:
        return await revoke_agent(client, AsyncScripts(client), settings, agent_id, who)
    except outages.TRANSIENT_ERRORS as exc:
        raise outages.unavailable(exc, settings) from exc
    finally:
        await client.aclose()


@secret_app.command("set")
@cli_errors
def secret_set(
    from_env: Annotated[str | None, typer.Option(
        "--from-env", metavar="VAR", help="Read the secret from this environment variable")] = None,
    generate: Annotated[bool, typer.Option(
        "--generate", help="Make a random secret and print it (once: only a verifier is kept)")] = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Set (or rotate) the join secret every new registration must present (REACH_JOIN_SECRET).
    The secret is read from a prompt, stdin or --from-env VAR, never from the command line.
    Agents already registered keep working; only new registrations need the new secret."""
    if from_env and generate:
        fail("give one of --from-env and --generate", EXIT_USAGE)
    secret = _read_secret(from_env, generate)
    settings = load_settings(config, redis_url)
    identity.check_secret(secret)

    def store(client: connection.SyncRedis) -> None:
        identity.set_secret(client, settings, secret, clock_of(client, RegistryKeys(settings.prefix).agents))

    read_redis(settings, store)
    if generate:
        typer.echo(secret)
    typer.echo("join secret set: agents already registered keep working; new registrations need "
               "it (REACH_JOIN_SECRET)", err=True)


def _read_secret(from_env: str | None, generate: bool) -> str:
    if generate:
        return secrets.token_urlsafe(32)
    if from_env:
        value = os.environ.get(from_env, "")
        if not value:
            fail(f"environment variable {from_env} is not set (or empty)", EXIT_USAGE)
        return value
    if sys.stdin.isatty():
        return str(typer.prompt("Join secret", hide_input=True, confirmation_prompt=True, err=True))
    return sys.stdin.readline().rstrip("\r\n")


@secret_app.command("clear")
@cli_errors
def secret_clear(redis_url: RedisUrlOption = None, config: ConfigOption = None) -> None:
    """Let agents register without a join secret again."""
    settings = load_settings(config, redis_url)
    cleared = read_redis(settings, lambda client: identity.clear_secret(client, settings))
    typer.echo("join secret cleared" if cleared else "no join secret was set")


@secret_app.command("status")
@cli_errors
def secret_status(as_json: JsonOption = False, redis_url: RedisUrlOption = None,
                  config: ConfigOption = None) -> None:
    """Whether a join secret is set, and since when (never the secret)."""
    settings = load_settings(config, redis_url)
    set_at = read_redis(settings, lambda client: identity.secret_set_at(client, settings))
    if as_json:
        print_json({"set": set_at is not None, "set_at_ms": set_at})
        return
    typer.echo(f"join secret set (at {set_at} ms, server clock)" if set_at else "no join secret set")
