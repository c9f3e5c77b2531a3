"""Typed settings, loaded once per process.

Precedence, highest first: explicit overrides (CLI flags) > environment (`REACH_<NAME>`,
`REDIS_URL`) > config file (`--config FILE`, else `$REACH_CONFIG`, else `./reach.toml`) > the
defaults below. Durations are milliseconds. Nothing needs a config file.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from broker.errors import ConfigError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")

# The file contents for the Settings being built right now (see Settings.load).
_file_values: ContextVar[Mapping[str, Any]] = ContextVar("_file_values")


class CapabilityConfig(BaseModel):
    """Per-capability options, from a `[capabilities.<name>]` table of the config file."""

    model_config = ConfigDict(extra="forbid")

    handler: str | None = None
    """`pkg.module:function` that serves this capability in `reach-worker`."""
    http: str | None = None
    """URL of an HTTP agent that serves this capability (instead of a Python handler)."""
    a2a: str | None = None
    """URL of an A2A agent that serves this capability (its card's skill `skill`, or the one
    named like the capability)."""
    skill: str | None = None
    description: str | None = None
    """What the capability does (else the handler's docstring): registered with the agent."""
    input_schema: dict[str, Any] | str | None = None
    """The payload's JSON Schema, or the path of a JSON file holding it."""
    output_schema: dict[str, Any] | str | None = None
    examples: list[Any] | None = None
    """Example payloads."""
    timeout_ms: int | None = Field(default=None, gt=0)
    max_attempts: int | None = Field(default=None, ge=1, le=100)
    retry_failures: bool = False
    """Treat an unclassified handler exception as retryable instead of a terminal `failure`."""
    aging_ms: int | None = Field(default=None, gt=0)
    max_queue_depth: int | None = Field(default=None, ge=1)
    no_agent_timeout_ms: int | None = Field(default=None, ge=0)
    rate: float | None = Field(default=None, ge=0)
    burst: int | None = Field(default=None, ge=0)
    max_running: int | None = Field(default=None, ge=0)
    # (A dispatcher seeds the fleet's policy in Redis from these: broker/policy.py.)


_NO_CAPABILITY_CONFIG = CapabilityConfig()
"""What a capability without a table of its own in the config file gets (never changed)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REACH_", extra="ignore", populate_by_name=True, validate_default=True
    )

    redis_url: str = Field(
        default=DEFAULT_REDIS_URL,
        validation_alias=AliasChoices("REDIS_URL", "REACH_REDIS_URL", "redis_url"),
        description="Redis URL. `reach up`/`demo` start an embedded Redis when none is given.",
    )
    cluster: bool = False
    prefix: str = "reach"
    tls_ca_file: str | None = None
    """PEM file of the CA certificates that sign the Redis server's (a `rediss://` URL); the
    URL's `?ssl_ca_certs=` wins. Unset: the system's trusted CAs."""
    tls_cert_file: str | None = None
    """PEM certificate this process presents to Redis (mutual TLS; the URL's `?ssl_certfile=`)."""
    tls_key_file: str | None = None
    """Its private key (the URL's `?ssl_keyfile=`)."""

    heartbeat_ms: int = Field(5000, gt=0)
    suspect_after_ms: int = Field(15000, gt=0)
    offline_after_ms: int = Field(30000, gt=0)
    agent_token_ttl_ms: int = Field(86400000, ge=0)
    """An agent's token expires this long after it was issued or last renewed (workers renew
    it every third of this); 0: tokens never expire."""
    join_secret: SecretStr | None = None
    """The fleet's join secret (`reach agents secret set`), presented when registering."""
    prune_after_ms: int = Field(86400000, gt=0)
    """An agent offline this long is removed from the registry (its record kept until then)."""
    stall_after_ms: int = Field(20000, gt=0)
    """An agent holding tasks whose executor loop made no progress for this long is not_ready."""
    lease_ms: int = Field(30000, gt=0)
    aging_ms: int = Field(30000, gt=0)
    max_attempts: int = Field(3, ge=1, le=100)
    backoff_base_ms: int = Field(500, ge=0)
    backoff_max_ms: int = Field(8000, ge=0)
    backoff_jitter_ms: int = Field(500, ge=0)
    watermark: float = Field(0.85, gt=0, le=1)
    backlog_factor: int = Field(5, ge=1)
    max_queue_depth: int = Field(100000, ge=1)
    max_payload_bytes: int = Field(1048576, ge=1)
    # Limits on what crosses a trust boundary (broker/limits.py checks them).
    max_result_bytes: int = Field(1048576, ge=1)
    """A handler's result larger than this (JSON bytes) fails the task as bad_result."""
    max_metadata_bytes: int = Field(65536, ge=1)
    max_progress_message_bytes: int = Field(65536, ge=1)
    """One progress report's JSON (fraction, message and fields): a larger one is refused."""
    max_json_depth: int = Field(64, ge=1, le=10000)
    """How deep payloads, results, metadata, progress and request bodies may nest."""
    max_progress_events: int = Field(100, ge=1)
    """A task keeps its latest this many progress events (older ones dropped and counted)."""
    gateway_rate_limit: float = Field(0.0, ge=0)
    """Requests per second the gateway takes from one API key (keyless: one client address);
    0: no limit. Over it: 429 with Retry-After."""
    gateway_rate_burst: int = Field(0, ge=0)
    """Requests one key may make at once (0: one second's worth of gateway_rate_limit, at least 1)."""
    result_ttl_ms: int = Field(86400000, gt=0)
    idempotency_ttl_ms: int = Field(86400000, gt=0)
    default_timeout_ms: int = Field(300000, gt=0)
    circuit_failures: int = Field(10, ge=1)
    circuit_open_ms: int = Field(10000, gt=0)
    cold_start_ms: int = Field(120000, ge=0)
    cold_start_max_priority: int = Field(4, ge=0, le=9)
    """While cold (recovered less than cold_start_ms ago) an agent gets tasks of this priority or lower."""
    latency_ceiling_ms: int = Field(0, ge=0)
    """Tasks slower than this count towards ejection (0: no ceiling)."""
    slow_tasks_to_eject: int = Field(5, ge=1)
    eject_ms: int = Field(30000, gt=0)
    """An ejected (too slow) agent gets a single probe task after this long."""
    slow_factor: float = Field(3.0, gt=1)
    slow_penalty: float = Field(30.0, ge=0)
    """Points an agent loses while its latency is above slow_factor x its own baseline."""
    weight_capacity: float = Field(0.35, ge=0)
    weight_affinity: float = Field(0.30, ge=0)
    weight_latency: float = Field(0.20, ge=0)
    weight_stability: float = Field(0.15, ge=0)
    affinity_window_ms: int = Field(300000, gt=0)
    """An agent that succeeded on the capability this recently gets (decaying) affinity."""
    drain_grace_ms: int = Field(30000, ge=0)
    no_agent_timeout_ms: int = Field(300000, ge=0)
    """Fail a task no agent started within this long with reason no_agent_timeout (0: never)."""
    rate: float = Field(0.0, ge=0)
    """Most task starts per second per capability, fleet-wide (0: no limit)."""
    burst: int = Field(0, ge=0)
    """How many starts the rate allows at once (0: the rate's one second, at least 1)."""
    max_running: int = Field(0, ge=0)
    """Most tasks of a capability handed out (dispatched or running) at once (0: no cap)."""
    event_feed_maxlen: int = Field(10000, ge=0)
    """Approximate length of each capability's event feed stream (0: no feed)."""
    dlq_retention_ms: int = Field(14 * 86400000, gt=0)
    """Dead letters older than this are trimmed; younger ones are never dropped."""
    dlq_maxlen: int = Field(0, ge=0)
    """Beyond this many entries (0: no limit), the oldest dead letters past the retention go first."""
    console_show_payloads: bool = True
    """Whether the console shows tasks' payloads and results (false for sensitive data)."""
    idle_tick_ms: int = Field(1000, gt=0)
    """Longest a dispatcher sleeps without a wake-up signal before it looks again."""
    dispatch_batch: int = Field(256, ge=1)
    metrics_addr: str | None = None
    """HOST:PORT where the process serves /metrics, /healthz and /readyz (port 0: a free one,
    logged); `off` for none. Unset: off for a worker, DISPATCHER_METRICS_ADDR for a dispatcher."""
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object a line (time, level, logger, message, and the task's fields)."""

    capabilities: dict[str, CapabilityConfig] = Field(default_factory=dict)

    @field_validator("metrics_addr")
    @classmethod
    def _check_metrics_addr(cls, value: str | None) -> str | None:
        if value is not None and value != "off":
            parse_address(value)
        return value

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file")
    @classmethod
    def _check_tls_file(cls, value: str | None) -> str | None:
        if value and not Path(value).is_file():
            raise ValueError(f"no such file: {value}")
        return value or None

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not _PREFIX_RE.match(value):
            raise ValueError("prefix must be 1-64 characters of letters, digits and _.:- (no braces)")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any) -> Settings:
        """Build settings from overrides, the environment and the config file.

        Overrides whose value is None are ignored, so CLI options can be passed straight through.
        """
        path = _config_path(config_file)
        values = _read_toml(path) if path else {}
        token = _file_values.set(values)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            raise ConfigError(_describe(exc, path)) from None
        finally:
            _file_values.reset(token)

    def capability(self, name: str) -> CapabilityConfig:
        return self.capabilities.get(name) or _NO_CAPABILITY_CONFIG

    def timeout_ms_for(self, name: str) -> int:
        return self.capability(name).timeout_ms or self.default_timeout_ms

    def max_attempts_for(self, name: str) -> int:
        return self.capability(name).max_attempts or self.max_attempts

    @property
    def redis_url_given(self) -> bool:
        """Whether a Redis URL came from a flag, the environment or the config file."""
        return "redis_url" in self.model_fields_set

    def tls_options(self) -> dict[str, str]:
        """redis-py's TLS options from the tls_* settings (none set: empty)."""
        options = {"ssl_ca_certs": self.tls_ca_file, "ssl_certfile": self.tls_cert_file,
                   "ssl_keyfile": self.tls_key_file}
        return {name: value for name, value in options.items() if value}

    def redacted_url(self) -> str:
        return redact_url(self.redis_url)

    def metrics_address(self, default: str | None) -> tuple[str, int] | None:
        """Where to serve metrics and health (host, port), or None for nowhere: metrics_addr,
        else the process kind's `default` (None: off)."""
        value = self.metrics_addr if self.metrics_addr is not None else default
        return None if value is None or value == "off" else parse_address(value)


DISPATCHER_METRICS_ADDR = "127.0.0.1:9464"
"""Where a dispatcher serves metrics unless told (a worker serves none unless told)."""


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port); ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT (port 0-65535; 0 picks a free one) or 'off', got {text!r}")
    return host, int(port)


class _FileSource(PydanticBaseSettingsSource):
    """Values from the config file chosen in Settings.load, below the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        values = _file_values.get({})
        return values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        known = set(self.settings_cls.model_fields)
        values = _file_values.get({})
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) in config file: {', '.join(unknown)}")
        return dict(values)


def _config_path(config_file: str | Path | None) -> Path | None:
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return path
    env = os.environ.get("REACH_CONFIG")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ConfigError(f"REACH_CONFIG points to a missing file: {path}")
        return path
    local = Path("reach.toml")
    return local if local.is_file() else None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    # Settings may sit at the top level or under a [reach] table.
    flat = dict(data.pop("reach", {}))
    flat.update(data)
    return flat


def _describe(exc: ValidationError, path: Path | None) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "settings"
    origin = f" (config file {path})" if path else ""
    return f"invalid setting {where}: {first['msg']}{origin}"


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe to log: the one after the user name (up to the
    last '@', as a password may hold '@'), and any query parameter named like a password
    (redis-py honours `?password=`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a Redis URL that cannot be parsed>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{hosts}"
    query = "&".join(
        f"{name}=***" if "password" in name.lower() else f"{name}={value}" if sep else name
        for name, sep, value in (pair.partition("=") for pair in parts.query.split("&") if pair))
    # (by hand: urlunsplit drops the '//' of an empty host, unix:///path)
    text = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else f"{netloc}{parts.path}"
    return text + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")
