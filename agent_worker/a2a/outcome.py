"""What a remote A2A task's end means for the Reach attempt (pure functions).

    completed                     success: the artifacts' parts (else the status message's)
    failed                        failure (never retried)
    rejected                      invalid_request
    canceled (by the agent)       failure
    input-required, auth-required failure: Reach has no one to ask
    transport errors              retryable (ConnectionError, TimeoutError)
    JSON-RPC errors               invalid params/request, content type: invalid_request;
                                  internal: retryable; the rest: failure
"""

from __future__ import annotations

from typing import Any

from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.types import Task, TaskState
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
)

from agent_worker.a2a.messages import message_text, parts_result
from agent_worker.errors import InvalidRequest, Retryable
from agent_worker.http_bridge.outcome import AgentFailed

TERMINAL = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                      TaskState.TASK_STATE_REJECTED, TaskState.TASK_STATE_CANCELED})
INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
_INVALID = (InvalidParamsError, InvalidRequestError, ContentTypeNotSupportedError)


def is_final(state: int) -> bool:
    return state in TERMINAL or state in INTERRUPTED


def task_result(task: Task) -> Any:
    """The result of a remote task that ended (or the exception its end means)."""
    state = task.status.state
    why = message_text(task.status.message) if task.status.HasField("message") else ""
    name = TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")
    if state == TaskState.TASK_STATE_COMPLETED:
        parts = [p for artifact in task.artifacts for p in artifact.parts]
        if not parts and task.status.HasField("message"):
            parts = list(task.status.message.parts)
        return parts_result(parts)
    if state == TaskState.TASK_STATE_REJECTED:
        raise InvalidRequest(why or "the A2A agent rejected the task")
    if state in INTERRUPTED:
        raise AgentFailed(f"the A2A agent asks for {name.removesuffix('-required')} "
                          f"(task state {name}), which Reach cannot give{': ' + why if why else ''}")
    if state in TERMINAL:
        raise AgentFailed(f"the A2A agent's task ended {name}{': ' + why if why else ''}")
    raise Retryable(f"the A2A agent's answer left its task {name}")


def error_outcome(exc: A2AError) -> Exception:
    """The exception (for the worker's classification) an A2A error means."""
    text = str(getattr(exc, "message", "") or exc)[:500]
    if isinstance(exc, A2AClientTimeoutError):
        return TimeoutError(f"the A2A agent did not answer in time: {text}")
    if isinstance(exc, A2AClientError):
        return ConnectionError(f"cannot reach the A2A agent: {text}")
    if isinstance(exc, _INVALID):
        return InvalidRequest(f"the A2A agent refused the request: {text}")
    if isinstance(exc, InternalError):
        return Retryable(f"the A2A agent failed internally: {text}")
    return AgentFailed(f"the A2A agent answered {type(exc).__name__}: {text}")
