"""The shapes of the API's requests and replies (its OpenAPI schema is made from these).

A submit's fields are SubmitOptions' (broker/protocol/submit.py) with the capability and the
payload; the library checks every value again (build_submit_request), so a value the schema
lets through and the library refuses is still a 422 naming it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from broker.ids import CAPABILITY_RE
from broker.protocol.submit import MAX_LABEL_LEN, SubmitOptions
from broker.protocol.trace import MAX_TRACESTATE_LEN

MAX_BATCH = 1000

Label = StrictStr
Seconds = StrictFloat
"""A number of seconds (an int is taken too; a bool or a string is not)."""


class TaskOptions(BaseModel):
    """How a task is to be run; every field is optional (see SubmitOptions)."""

    model_config = ConfigDict(extra="forbid")

    priority: StrictInt = Field(5, ge=0, le=9, description="0-9, higher runs first")
    session_id: Label | None = Field(None, min_length=1, max_length=MAX_LABEL_LEN)
    region: Label | None = Field(None, min_length=1, max_length=MAX_LABEL_LEN)
    region_strict: StrictBool = True
    version: Label | None = Field(None, min_length=1, max_length=MAX_LABEL_LEN,
                                  description="a constraint on the agent's version, e.g. '>=2.3,<3'")
    idempotency_key: Label | None = Field(None, min_length=1, max_length=MAX_LABEL_LEN)
    timeout_s: Seconds | None = Field(None, gt=0, description="each attempt's execution timeout")
    deadline_s: Seconds | None = Field(None, gt=0, description="the whole task's budget from now")
    max_attempts: StrictInt | None = Field(None, ge=1, le=100)
    traceparent: Label | None = Field(
        None, min_length=1, max_length=MAX_LABEL_LEN,
        description="W3C traceparent the task runs in (or the `traceparent` header); default: a new trace",
        examples=["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"])
    tracestate: Label | None = Field(None, min_length=1, max_length=MAX_TRACESTATE_LEN,
                                     description="W3C tracestate (or the `tracestate` header)")
    trace_id: Label | None = Field(None, min_length=1, max_length=MAX_LABEL_LEN,
                                   description="a W3C trace id (32 hex) to start the task's trace in")
    metadata: dict[str, Any] | None = Field(None, description="handed to the handler as ctx.metadata")
    delay_s: Seconds | None = Field(None, gt=0, description="queue it after this many seconds")
    at: datetime | None = Field(None, description="queue it at this time (ISO 8601 with a zone)")

    def options(self, idempotency_key: str | None = None) -> SubmitOptions:
        # (the fields the request set; the others keep SubmitOptions' defaults, which are this
        # model's: model_dump would convert and copy all eighteen for every submit)
        values = {name: getattr(self, name) for name in self.model_fields_set if name in OPTION_FIELDS}
        if idempotency_key is not None:
            values["idempotency_key"] = idempotency_key
        return SubmitOptions(**values)


OPTION_FIELDS = frozenset(TaskOptions.model_fields)


class SubmitBody(TaskOptions):
    capability: StrictStr = Field(pattern=CAPABILITY_RE.pattern.removesuffix("\\Z") + "$",
                                  examples=["summarize"])
    payload: Any = Field(description="any JSON value (strict: no NaN or Infinity)",
                         examples=[{"text": "One sentence. Another one."}])


class BatchBody(TaskOptions):
    """One capability, many payloads, the same options for each."""

    capability: StrictStr = Field(pattern=CAPABILITY_RE.pattern.removesuffix("\\Z") + "$")
    payloads: list[Any] = Field(min_length=1, max_length=MAX_BATCH)


class Submitted(BaseModel):
    task_id: str
    capability: str
    state: str = Field(description="queued or scheduled (the state a new task starts in); a "
                                   "repeated idempotency key answers the first task's state now")
    created: bool = Field(description="false when the idempotency key was seen before")


class BatchSubmitted(BaseModel):
    tasks: list[Submitted]


class TaskJson(BaseModel):
    """A task as `reach status --json` shows it."""

    task_id: str
    capability: str
    state: str
    priority: int
    attempt: int
    agent_id: str | None
    created_at: str | None
    finished_at: str | None
    reason: str | None
    error: str | None
    progress_dropped: int = Field(0, description="progress events dropped to keep the latest "
                                                 "max_progress_events")


class TaskRow(TaskJson):
    trace_id: str | None


class TaskPageJson(BaseModel):
    """One page of a task search, newest first."""

    tasks: list[TaskRow]
    next_cursor: str | None = Field(description="pass it as `cursor` for the next page; null: "
                                                "no older task is left")
    scanned: int = Field(description="how many task records this page looked at")


class TaskResult(BaseModel):
    task_id: str
    state: str
    result: Any = None
    reason: str | None = None
    error: str | None = None


class Canceled(BaseModel):
    task_id: str
    canceled: bool
    state: str


class CallbackBody(BaseModel):
    """What an HTTP agent posts when a task it accepted (202) ends: its business status."""

    model_config = ConfigDict(extra="allow")

    status: Literal["success", "invalid_request", "failure", "retryable_failure"]
    result: Any = None
    error: StrictStr | None = Field(None, max_length=10_000)
    retry_after_s: Seconds | None = Field(None, ge=0, le=86_400)


class CallbackTaken(BaseModel):
    accepted: bool
    duplicate: bool = False


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
