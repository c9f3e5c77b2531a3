"""Options and helpers every `reach` command shares."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from broker.settings import Settings

RedisUrlOption = Annotated[str | None, typer.Option("--redis-url", help="Redis URL (else REDIS_URL)")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Config file (else REACH_CONFIG, ./reach.toml)")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output")]

console = Console()
err_console = Console(stderr=True)


def load_settings(config: Path | None, redis_url: str | None, **overrides: Any) -> Settings:
    return Settings.load(config, redis_url=redis_url, **overrides)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, ensure_ascii=False, default=str))
