"""How the processes log: readable text (the default) or one JSON object a line
(`REACH_LOG_FORMAT=json`, `--log-format json`), and the task a line is about.

A line about a task carries its fields (task_id, trace_id, capability, attempt; agent_id in a
worker): bound for the whole attempt with `bind_task` (a context variable, so a handler's own
log lines carry them too: asyncio tasks copy the context they start in, and the worker runs
sync handlers in a copy of it), or given to one call as `extra=task_extra(...)`. A process's
own fields (a worker's agent_id) are set once with `set_process_fields`.

Nothing here logs secrets: the callers log Redis URLs redacted (Settings.redacted_url) and
never a token; `redact` is the last guard for text that came from elsewhere (an exception's
message).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextvars import ContextVar, Token
from typing import Any, Literal

BOUND_FIELDS = ("task_id", "trace_id", "capability", "attempt")

Bound = tuple[str | None, str | None, str | None, int | None]
"""A task's fields as BOUND_FIELDS names them (a tuple: binding one costs an attempt's start
little)."""

_task: ContextVar[Bound | None] = ContextVar("reach_task", default=None)
_process: dict[str, Any] = {}

# user:password@ in a URL, and password=... in a query or a message.
_SECRETS = ((re.compile(r"(://[^:/@\s]*:)\S*@"), r"\1***@"),
            (re.compile(r"(?i)(password=)[^&\s]+"), r"\1***"))


def redact(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def task_fields(task_id: str, trace_id: str | None, capability: str, attempt: int | None) -> Bound:
    return (task_id, trace_id, capability, attempt)


def bind_task(fields: Bound) -> Token[Bound | None]:
    """Lines logged in this context (and in tasks started from it) are about this task."""
    return _task.set(fields)


def unbind_task(token: Token[Bound | None]) -> None:
    _task.reset(token)


def task_extra(fields: Bound) -> dict[str, Any]:
    """`extra=` for one log call about a task, outside the task's own context."""
    return {"reach_task": fields}


def set_process_fields(**fields: Any) -> None:
    """Fields every line of this process carries (a worker's agent_id)."""
    _process.update(fields)


class TaskFilter(logging.Filter):
    """Stamps a record with the task its context is about, when it is made (a handler that
    formats later, or on another thread, still knows)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "reach_task", None) is None:
            record.reach_task = _task.get()
        return True


def _bound(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of the task the record is about (none given: empty)."""
    bound = getattr(record, "reach_task", None) or _task.get()
    if not bound:
        return {}
    return {name: value for name, value in zip(BOUND_FIELDS, bound, strict=True) if value is not None}


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    return {**_process, **_bound(record)}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name,
            "message": redact(record.getMessage()),
        }
        line.update(_fields_of(record))
        if record.exc_info:
            line["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, and the task's fields in brackets on a line about one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = redact(super().format(record))
        bound = _bound(record)
        if not bound:
            return text
        about = " ".join(f"{name}={value}" for name, value in bound.items())
        head, newline, rest = text.partition("\n")  # (after the message, before a traceback)
        return f"{head} [{about}]{newline}{rest}"


def setup(level: str = "INFO", fmt: Literal["text", "json"] = "text") -> None:
    """Log to stderr at `level` in `fmt` (replacing any handler set up before)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TaskFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
