"""Finding the handler for each capability and calling it the same way, sync or async.

A handler is `handler(ctx, payload)`, a coroutine function or a plain function (plain ones run
in a thread so they never block the worker's event loop). If the payload parameter is annotated
with a pydantic model, the payload is validated into it first; a validation error is an
`invalid_request`.

Where a capability's handler comes from, first match wins:
`--capability name=pkg.mod:func` > `--handler` > `--http URL` > `--a2a URL` > the config
file's `[capabilities.<name>]` table > a built-in agent of that name.

Each binding carries the capability's description (agent_worker/describe.py): derived from the
handler, overridden by the config file's table and then by `--describe`.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agent_worker import describe
from agent_worker.binding import Binding, Handler
from agent_worker.builtin import BUILTIN_HANDLERS
from broker.errors import ConfigError
from broker.ids import check_capability
from broker.settings import Settings

if TYPE_CHECKING:
    from agent_worker.a2a import A2aAgent
    from agent_worker.http_bridge.options import BridgeOptions

def load_handler(spec: str) -> Handler:
    """Import `pkg.module:function` (a ConfigError says what is wrong)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"handler {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import handler module {module_name!r}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise ConfigError(f"handler {spec!r} is not callable")
    return typing.cast(Handler, target)


def payload_model_of(handler: Handler) -> type[BaseModel] | None:
    try:
        params = list(inspect.signature(handler).parameters.values())
        hints = typing.get_type_hints(handler)
    except (TypeError, ValueError, NameError):
        return None
    if len(params) < 2:
        return None
    hint = hints.get(params[1].name)
    if inspect.isclass(hint) and issubclass(hint, BaseModel):
        return hint
    return None


def _is_async(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def make_binding(settings: Settings, capability: str, spec: str | None = None, http: str | None = None,
                 source: str = "", http_options: BridgeOptions | None = None,
                 a2a: A2aAgent | None = None) -> Binding:
    """`http_options`: the worker's BridgeOptions for HTTP agents (agent_worker/http_bridge);
    `a2a`: the A2A agent serving it (agent_worker/a2a)."""
    config = settings.capability(capability)
    if spec is None and http is None and a2a is None:
        spec, http = config.handler, config.http
        source = "config file"
        if config.a2a is not None and spec is None and http is None:
            from agent_worker.a2a import A2aAgent, A2aOptions

            a2a = A2aAgent(A2aOptions.build(config.a2a, config.skill or capability))
        if spec is None and http is None and a2a is None:
            spec = BUILTIN_HANDLERS.get(capability)
            source = "built-in"
    if http is not None:
        from agent_worker.http_bridge.agent import HttpAgent

        handler: Handler = HttpAgent(http, http_options)
        source = source or "http"
    elif a2a is not None:
        handler = a2a
        source = f"a2a {a2a.options.url} skill {a2a.options.skill}"
    elif spec is not None:
        handler = load_handler(spec)
        source = source or spec
    else:
        raise ConfigError(
            f"no handler for capability {capability!r}: pass --handler pkg.mod:func, "
            f"--capability {capability}=pkg.mod:func or --http URL, or add [capabilities.{capability}] "
            "to the config file"
        )
    return Binding(
        capability=capability,
        handler=handler,
        source=source,
        is_async=_is_async(handler),
        payload_model=payload_model_of(handler),
        timeout_ms=settings.timeout_ms_for(capability),
        retry_failures=config.retry_failures,
        description=describe.derived(handler).merged(describe.from_config(config)),
    )


def resolve_bindings(settings: Settings, capabilities: list[str], handler: str | None = None,
                     http: str | None = None, http_options: BridgeOptions | None = None,
                     a2a: dict[str, A2aAgent] | None = None, describes: list[str] | None = None
                     ) -> list[Binding]:
    """Bindings for `--capability` values (`name` or `name=pkg.mod:func`); `a2a` maps
    capabilities to the A2A agent serving each; `describes` are `--describe` values."""
    if not capabilities:
        raise ConfigError("give at least one --capability")
    bindings = _bindings(settings, capabilities, handler, http, http_options, a2a or {})
    given = describe.parse_describe(describes or [], [b.capability for b in bindings])
    return [replace(b, description=b.description.merged(given[b.capability])) if b.capability in given
            else b for b in bindings]


def _bindings(settings: Settings, capabilities: list[str], handler: str | None, http: str | None,
              http_options: BridgeOptions | None, a2a: dict[str, A2aAgent]) -> list[Binding]:
    out: dict[str, Binding] = {}
    for item in capabilities:
        name, sep, spec = item.partition("=")
        check_capability(name)
        if name in out:
            raise ConfigError(f"capability {name!r} given twice")
        if sep:
            if not spec:
                raise ConfigError(f"--capability {item!r}: expected name=package.module:function")
            out[name] = make_binding(settings, name, spec=spec, source=spec)
        elif handler is not None:
            out[name] = make_binding(settings, name, spec=handler, source=handler)
        elif http is not None:
            out[name] = make_binding(settings, name, http=http, source=http, http_options=http_options)
        elif name in a2a:
            out[name] = make_binding(settings, name, a2a=a2a[name])
        else:
            out[name] = make_binding(settings, name, http_options=http_options)
    return list(out.values())
