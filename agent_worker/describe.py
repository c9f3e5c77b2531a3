"""What each capability a worker serves does and takes: its description, registered with the
agent (`reach capabilities`, the gateway's A2A skills and MCP tools read it).

Derived from the handler, then overridden field by field by what is given:

    description    the handler's docstring
    input_schema   the JSON Schema of its payload annotation (a pydantic model is also what the
                   worker validates the payload with)
    output_schema  the JSON Schema of its return annotation
    examples       the payload schema's `examples` (a model's json_schema_extra)

A bridge handler (`--a2a`) describes itself (`describe()`); the config file's
`[capabilities.<name>]` table (description, input_schema, output_schema, examples) and
`reach-worker --describe` override what was derived.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from broker.errors import ConfigError
from broker.models import MAX_DESCRIPTION_BYTES, CapabilityDescription, described_json
from broker.settings import CapabilityConfig

Handler = Callable[..., Any]
_MAX_TEXT = 4000


def derived(handler: Handler) -> CapabilityDescription:
    """What the handler itself says about the capability."""
    describe = getattr(handler, "describe", None)
    if callable(describe) and not inspect.isfunction(handler):
        told = describe()
        return told if isinstance(told, CapabilityDescription) else CapabilityDescription()
    text = inspect.getdoc(handler) if inspect.isfunction(handler) or inspect.ismethod(handler) else None
    params, hints = _signature(handler)
    input_schema = _schema(hints.get(params[1])) if len(params) >= 2 else None
    examples = (input_schema or {}).get("examples")
    return CapabilityDescription(
        description=text[:_MAX_TEXT] if text else None,
        input_schema=input_schema,
        output_schema=_schema(hints.get("return"), mode="serialization"),
        examples=examples[:20] if isinstance(examples, list) else [],
    )


def _signature(handler: Handler) -> tuple[list[str], dict[str, Any]]:
    try:
        params = list(inspect.signature(handler).parameters)
        hints = typing.get_type_hints(handler)
    except (TypeError, ValueError, NameError):
        return [], {}
    return params, hints


def _schema(hint: Any, mode: typing.Literal["validation", "serialization"] = "validation"
            ) -> dict[str, Any] | None:
    """The JSON Schema of an annotation; None for none, Any, or one pydantic cannot render."""
    if hint is None or hint is Any or hint is type(None):
        return None
    try:
        if inspect.isclass(hint) and issubclass(hint, BaseModel):
            return hint.model_json_schema(mode=mode)
        return TypeAdapter(hint).json_schema(mode=mode)
    except Exception:  # (pydantic raises several kinds for types it cannot render)
        return None


def from_config(config: CapabilityConfig, base: Path | None = None) -> CapabilityDescription:
    """What a `[capabilities.<name>]` table says (schemas inline, or paths of JSON files)."""
    return _checked(CapabilityDescription, {
        "description": config.description,
        "input_schema": _json_or_file(config.input_schema, base, "input_schema"),
        "output_schema": _json_or_file(config.output_schema, base, "output_schema"),
        "examples": config.examples or [],
    }, "the config file")


def _json_or_file(value: dict[str, Any] | str | None, base: Path | None, what: str) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    path = Path(value) if base is None or Path(value).is_absolute() else base / value
    loaded = _read_json(path, what)
    if not isinstance(loaded, dict):
        raise ConfigError(f"{what} in {path} must be a JSON object (a JSON Schema)")
    return loaded


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} from {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{what} in {path} is not JSON: {exc}") from None


def parse_describe(items: Iterable[str], capabilities: list[str]) -> dict[str, CapabilityDescription]:
    """`--describe [CAP=]TEXT` or `--describe [CAP=]@FILE.json` (a JSON object with description,
    input_schema, output_schema, examples); CAP may be left out when one capability is served."""
    out: dict[str, CapabilityDescription] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in capabilities:
            if len(capabilities) != 1:
                raise ConfigError(f"--describe {item[:40]!r}: say which capability, as CAP=TEXT or "
                                  "CAP=@FILE.json (this worker serves several)")
            name, value = capabilities[0], item
        if value.startswith("@"):
            loaded = _read_json(Path(value[1:]), "--describe")
            if not isinstance(loaded, dict):
                raise ConfigError(f"--describe {value}: the file must hold a JSON object")
            given = _checked(CapabilityDescription, loaded, f"--describe {value}")
        else:
            given = _checked(CapabilityDescription, {"description": value}, "--describe")
        out[name] = out[name].merged(given) if name in out else given
    return out


def _checked(model: type[CapabilityDescription], data: dict[str, Any], where: str) -> CapabilityDescription:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "description"
        raise ConfigError(f"{where}: {field}: {first['msg']}") from None


def registered(descriptions: dict[str, CapabilityDescription]) -> str:
    """The JSON registered with the agent; ConfigError for one too large to register."""
    for name, description in descriptions.items():
        size = len(described_json({name: description}))
        if size > MAX_DESCRIPTION_BYTES:
            raise ConfigError(f"the description of {name!r} takes {size} bytes of JSON; at most "
                              f"{MAX_DESCRIPTION_BYTES} (shorten its schemas or examples)")
    return described_json(descriptions)
