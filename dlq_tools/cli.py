"""`reach dlq ...`: inspect, replay and purge dead letters."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Inspect, replay and purge the dead-letter streams.")
