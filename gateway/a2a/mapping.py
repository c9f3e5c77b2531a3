"""Reach's tasks in A2A's words (pure functions).

A message's payload is its data part, else its text parts as `{"text": ...}`; files and raw
bytes are not a payload Reach can route. States:

    scheduled, queued, dispatched  -> submitted
    running, retrying              -> working
    succeeded                      -> completed (the result as an artifact with one data part)
    failed                         -> failed, or rejected when the reason is invalid_request
    canceled                       -> canceled

A task's events become status updates (progress: `working` with the progress message and a
data part {"progress", "message", ...}); each carries its event's sequence number in
`metadata.reach.seq`, the position a client resumes from (SubscribeToTask with the header
`Last-Event-ID: <seq>`). Events that change nothing A2A shows (a second `queued`, a rejected
late result, the dead letter after the failure) make none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from broker.codec import whole_numbers
from broker.models import TaskEvent

RESULT_ARTIFACT = "result"
_STATES = {
    "scheduled": TaskState.TASK_STATE_SUBMITTED, "queued": TaskState.TASK_STATE_SUBMITTED,
    "dispatched": TaskState.TASK_STATE_SUBMITTED, "running": TaskState.TASK_STATE_WORKING,
    "retrying": TaskState.TASK_STATE_WORKING, "succeeded": TaskState.TASK_STATE_COMPLETED,
    "canceled": TaskState.TASK_STATE_CANCELED,
}
_EVENT_STATES = {
    "scheduled": TaskState.TASK_STATE_SUBMITTED, "queued": TaskState.TASK_STATE_SUBMITTED,
    "replayed": TaskState.TASK_STATE_SUBMITTED, "reclaimed": TaskState.TASK_STATE_SUBMITTED,
    "dispatched": TaskState.TASK_STATE_SUBMITTED, "accepted": TaskState.TASK_STATE_WORKING,
    "progress": TaskState.TASK_STATE_WORKING, "retry_scheduled": TaskState.TASK_STATE_WORKING,
    "succeeded": TaskState.TASK_STATE_COMPLETED, "canceled": TaskState.TASK_STATE_CANCELED,
}
COMPLETED = TaskState.TASK_STATE_COMPLETED
TERMINAL = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                      TaskState.TASK_STATE_REJECTED, TaskState.TASK_STATE_CANCELED})


def a2a_state(state: str, reason: str | None = None) -> TaskState:
    if state == "failed":
        return TaskState.TASK_STATE_REJECTED if reason == "invalid_request" else TaskState.TASK_STATE_FAILED
    return _STATES.get(state, TaskState.TASK_STATE_SUBMITTED)


def payload_of(message: Message) -> tuple[Any, bool]:
    """(the payload, whether it came from text parts); InvalidParams or ContentTypeNotSupported
    when the message holds nothing Reach can route."""
    if not message.parts:
        raise InvalidParamsError("the message has no parts: send the payload as a data part, or a text part")
    data = [p for p in message.parts if p.WhichOneof("content") == "data"]
    texts = [p.text for p in message.parts if p.WhichOneof("content") == "text"]
    if len(data) > 1:
        raise InvalidParamsError("the message has several data parts: send the payload as one")
    if data:
        return whole_numbers(MessageToDict(data[0].data)), False
    if texts:
        return {"text": "\n".join(texts)}, True
    kinds = sorted({str(p.WhichOneof("content")) for p in message.parts})
    raise ContentTypeNotSupportedError(f"the message has no data or text part (it has {', '.join(kinds)}): "
                                       "Reach routes JSON payloads and text")


def data_part(value: Any) -> Part:
    target = Value()
    ParseDict(value, target)
    return Part(data=target)


def user_message(task_id: str, context_id: str, payload: Any, a2a: dict[str, Any]) -> Message:
    """The message a task came from, as its history holds it."""
    text = a2a.get("text") and isinstance(payload, dict) and isinstance(payload.get("text"), str)
    part = Part(text=payload["text"]) if text else data_part(payload)
    return Message(message_id=str(a2a.get("message_id") or f"{task_id}-request"), role=Role.ROLE_USER,
                   task_id=task_id, context_id=context_id, parts=[part])


def result_artifact(result: Any) -> Artifact:
    return Artifact(artifact_id=RESULT_ARTIFACT, name="result", parts=[data_part(result)])


@dataclass
class Status:
    """What a task's events say of it up to some event: its A2A state and the status message."""

    state: TaskState = TaskState.TASK_STATE_SUBMITTED
    text: str = ""
    data: dict[str, Any] | None = None
    time: datetime | None = None
    seq: int = 0
    reason: str | None = None


def event_status(event: TaskEvent, before: Status) -> Status | None:
    """The status after `event`, or None when it shows nothing new."""
    data = event.data
    if event.type in ("failed", "expired"):
        if before.state in TERMINAL:
            return None  # (`expired` came first)
        reason = str(data.get("reason") or "failure")
        state = TaskState.TASK_STATE_REJECTED if reason == "invalid_request" else TaskState.TASK_STATE_FAILED
        text = f"{reason}: {data.get('error')}" if data.get("error") else reason
        detail = {"reason": reason, "error": data.get("error")}
        return Status(state, text, detail, event.time, event.seq, reason)
    found = _EVENT_STATES.get(event.type)
    if found is None or (before.state in TERMINAL and event.type not in ("queued", "replayed")):
        return None  # (nothing A2A shows; the dead letter after its failure; a late result)
    state = found
    if event.type == "progress":
        progress = {"progress": data.get("fraction"), "message": data.get("message"),
                    **{k: v for k, v in data.items() if k not in ("fraction", "message")}}
        return Status(state, str(data.get("message") or ""), progress, event.time, event.seq)
    if state == before.state and event.type not in ("retry_scheduled", "canceled"):
        return None
    return Status(state, _lifecycle_text(event), None, event.time, event.seq)


def _lifecycle_text(event: TaskEvent) -> str:
    data, agent = event.data, event.agent_id or "an agent"
    texts = {
        "accepted": f"running on {agent} (attempt {event.attempt})",
        "retry_scheduled": f"attempt {event.attempt} failed ({data.get('error') or 'retryable'}); "
                           f"trying again in {int(data.get('delay_ms') or 0)} ms",
        "reclaimed": f"attempt {event.attempt} lost ({data.get('reason') or 'its lease lapsed'}); "
                     "queued again",
        "canceled": "canceled",
        "succeeded": "completed",
        "replayed": "replayed from the dead-letter stream",
    }
    return texts.get(event.type, event.type)


def fold(events: list[TaskEvent], upto: int | None = None) -> Status:
    """The status the events up to seq `upto` (all, when None) leave."""
    status = Status()
    for event in events:
        if upto is not None and event.seq > upto:
            break
        status = event_status(event, status) or status
    return status


def task_status(status: Status, task_id: str, context_id: str) -> TaskStatus:
    out = TaskStatus(state=status.state)
    if status.time is not None:
        out.timestamp.FromDatetime(status.time)
    if status.text or status.data:
        parts = [Part(text=status.text)] if status.text else []
        if status.data:
            parts.append(data_part({k: v for k, v in status.data.items() if v is not None}))
        out.message.CopyFrom(Message(message_id=f"{task_id}-{status.seq}", role=Role.ROLE_AGENT,
                                     task_id=task_id, context_id=context_id, parts=parts))
    return out


def position(seq: int, event: str) -> dict[str, Any]:
    """The metadata every streamed event carries: where to resume after it."""
    return {"reach": {"seq": seq, "event": event}}


def status_update(status: Status, event: str, task_id: str, context_id: str) -> TaskStatusUpdateEvent:
    update = TaskStatusUpdateEvent(task_id=task_id, context_id=context_id,
                                   status=task_status(status, task_id, context_id))
    update.metadata.update(position(status.seq, event))
    return update


def artifact_update(result: Any, seq: int, task_id: str, context_id: str) -> TaskArtifactUpdateEvent:
    update = TaskArtifactUpdateEvent(task_id=task_id, context_id=context_id, artifact=result_artifact(result),
                                     last_chunk=True)
    update.metadata.update(position(seq, "succeeded"))
    return update


def new_task(task_id: str, context_id: str, status: Status, history: list[Message],
             result: Any = None, extra: dict[str, Any] | None = None) -> Task:
    task = Task(id=task_id, context_id=context_id, status=task_status(status, task_id, context_id),
                history=history)
    if status.state == TaskState.TASK_STATE_COMPLETED:
        task.artifacts.append(result_artifact(result))
    task.metadata.update({"reach": {"seq": status.seq, **(extra or {})}})
    return task
