"""A Reach task as an A2A message, and an A2A answer as a Reach result (pure functions).

The payload goes as the message's one part: a text part when it is a string or `{"text": ...}`
alone (what most A2A agents read), a data part otherwise. The result is what the answer's parts
hold: one data part's value; text parts as `{"text": ...}`; several kinds as `{"parts": [...]}`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from a2a.types import Message, Part, Role
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from agent_worker.context import TaskContext
from broker.codec import whole_numbers


def request_message(ctx: TaskContext, payload: Any, skill: str) -> Message:
    """The message that asks the remote agent to do one attempt of the task."""
    message = Message(message_id=f"reach-{ctx.task_id}-{ctx.attempt}", role=Role.ROLE_USER,
                      parts=[payload_part(payload)])
    if ctx.session_id:
        message.context_id = ctx.session_id  # (the conversation goes on with the same context)
    message.metadata.update({"skill": skill, "reach": {
        "task_id": ctx.task_id, "attempt": ctx.attempt, "trace_id": ctx.trace_id}})
    return message


def payload_part(payload: Any) -> Part:
    if isinstance(payload, str):
        return Part(text=payload)
    if isinstance(payload, dict) and set(payload) == {"text"} and isinstance(payload["text"], str):
        return Part(text=payload["text"])
    value = Value()
    ParseDict(payload, value)
    return Part(data=value)


def parts_result(parts: Iterable[Part]) -> Any:
    """What a list of parts (an answer's artifacts, or its message) means as a Reach result."""
    parts = list(parts)
    kinds = {p.WhichOneof("content") for p in parts}
    if kinds == {"data"} and len(parts) == 1:
        return whole_numbers(MessageToDict(parts[0].data))
    if kinds == {"text"}:
        return {"text": "".join(p.text for p in parts)}
    if not parts:
        return None
    return {"parts": [MessageToDict(p) for p in parts]}


def message_text(message: Message) -> str:
    """A status message's text (its text parts joined), for progress and errors."""
    return " ".join(p.text for p in message.parts if p.WhichOneof("content") == "text").strip()


def progress_of(message: Message) -> tuple[float | None, dict[str, Any]]:
    """A status message's progress fraction and data fields, when a data part gives them
    (as Reach's gateway writes them: {"progress": 0.4, "message": ...})."""
    for part in message.parts:
        if part.WhichOneof("content") == "data":
            data = whole_numbers(MessageToDict(part.data))
            if isinstance(data, dict):
                fraction = data.get("progress")
                extra = {k: v for k, v in data.items() if k not in ("progress", "message")}
                if isinstance(fraction, int | float) and not isinstance(fraction, bool) \
                        and 0 <= fraction <= 1:
                    return float(fraction), extra
                return None, extra
    return None, {}
