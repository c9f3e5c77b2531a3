"""`reach acl`: the Redis ACL user a role needs (broker/acl.py holds the roles)."""

import secrets
from typing import Annotated

import typer

from broker.acl import Role, password_hash, rule
from reach_cli.common import (
    EXIT_USAGE,
    ConfigOption,
    JsonOption,
    cli_errors,
    fail,
    load_settings,
    print_json,
)


@cli_errors
def acl(
    role: Annotated[Role, typer.Option(help="producer, agent, dispatcher, operator, reader or gateway")],
    prefix: Annotated[str | None, typer.Option(
        help="The key prefix (a tenant) the user may touch (else the configured prefix)")] = None,
    user: Annotated[str | None, typer.Option(help="The user name (else PREFIX-ROLE)")] = None,
    redis_version: Annotated[int, typer.Option(
        help="6 (6.2: no read-only key patterns) or 7 (7.0 and later)")] = 7,
    password: Annotated[str | None, typer.Option(
        help="The user's password (else a random one, printed once on stderr); only its "
             "SHA-256 goes into the rule", envvar="REACH_ACL_PASSWORD", show_envvar=False)] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Print the ACL SETUSER command and the aclfile line for a role's Redis user."""
    if redis_version not in (6, 7):
        fail("--redis-version must be 6 or 7", EXIT_USAGE)
    settings = load_settings(config, None, prefix=prefix)
    made = rule(role, settings.prefix, user, redis_version)
    generated = password is None
    secret = secrets.token_urlsafe(24) if password is None else password
    digest = password_hash(secret)
    if as_json:
        out = {"user": made.user, "role": str(role), "prefix": made.prefix,
               "redis_version": redis_version, "setuser": made.setuser(digest),
               "aclfile": made.aclfile_line(digest)}
        print_json({**out, "password": secret} if generated else out)
        return
    typer.echo(made.setuser(digest))
    typer.echo(made.aclfile_line(digest))
    if generated:
        typer.echo(f"# password of {made.user} (generated, shown once): {secret}", err=True)
