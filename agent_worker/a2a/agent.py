"""`--a2a URL`: an A2A agent, anywhere, becomes a Reach agent (with leases, retries, routing and
a dead-letter stream in front of it).

Each attempt is one `SendMessage` to the agent (agent_worker/a2a/messages.py says what the
message holds). When the agent's card says it streams, the answer is a stream whose status
updates become the task's progress events; otherwise the message is sent with
`returnImmediately` and the task is polled (GetTask) until it ends. The remote task's end is
the attempt's outcome (outcome.py). A Reach attempt that is canceled or runs out of time cancels
the remote task (CancelTask) before it gives up.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from a2a.client import Client, ClientCallContext
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError

from agent_worker.a2a.cards import skill_description
from agent_worker.a2a.messages import message_text, parts_result, progress_of, request_message
from agent_worker.a2a.options import CANCEL_TIMEOUT_S, POLL_FIRST_S, POLL_MAX_S, A2aOptions
from agent_worker.a2a.outcome import error_outcome, is_final, task_result
from agent_worker.context import TaskContext
from agent_worker.http_bridge.outcome import AgentFailed
from broker.errors import InvalidPayload
from broker.models import CapabilityDescription

if TYPE_CHECKING:
    from agent_worker.a2a.bridge import A2aBridge

log = logging.getLogger("reach.worker")
_WORKING = (TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_SUBMITTED)


@dataclass
class _Remote:
    """What one attempt learned of its remote task."""

    task_id: str = ""
    context_id: str = ""
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    last_status: str = ""

    def take_artifact(self, artifact: Artifact, append: bool) -> None:
        known = self.artifacts.get(artifact.artifact_id)
        if append and known is not None:
            known.parts.extend(artifact.parts)
        else:
            copy = Artifact()
            copy.CopyFrom(artifact)
            self.artifacts[artifact.artifact_id] = copy


class A2aAgent:
    def __init__(self, options: A2aOptions, card: AgentCard | None = None) -> None:
        self.options = options
        self.card = card
        """The card read at start, if it could be (the bridge keeps the current one)."""
        self._bridge: A2aBridge | None = None

    def __repr__(self) -> str:
        return f"A2aAgent({self.options.url!r}, skill={self.options.skill!r})"

    def describe(self) -> CapabilityDescription:
        return skill_description(self.card, self.options.skill) if self.card else CapabilityDescription()

    def attach(self, bridge: A2aBridge) -> None:
        self._bridge = bridge

    @property
    def bridge(self) -> A2aBridge:
        if self._bridge is None:
            raise RuntimeError("an A2aAgent runs inside a worker (Worker attaches its A2aBridge)")
        return self._bridge

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        bridge = self.bridge
        found = bridge.client_for(self.options)
        if found is None:
            bridge.readiness.check_soon()
            raise ConnectionError(f"the agent card of {self.options.url} has not been fetched yet")
        card, client = found
        call = ClientCallContext(service_parameters=dict(self.options.headers))
        streaming = card.capabilities.streaming
        request = SendMessageRequest(message=request_message(ctx, payload, self.options.skill),
                                     configuration=SendMessageConfiguration(return_immediately=not streaming))
        request.metadata.update({"skill": self.options.skill})  # (where some agents read it)
        remote = _Remote()
        try:
            return await self._run(client, call, request, ctx, remote)
        except asyncio.CancelledError:
            if remote.task_id:
                await self._cancel_remote(client, call, remote.task_id)
            raise
        except A2AError as exc:
            mapped = error_outcome(exc)
            if isinstance(mapped, ConnectionError):
                bridge.readiness.check_soon()
            raise mapped from None
        except ValueError as exc:  # (the card offers no interface this client speaks)
            raise AgentFailed(f"cannot talk to the A2A agent {self.options.url}: {exc}") from None

    async def _run(self, client: Client, call: ClientCallContext, request: SendMessageRequest,
                   ctx: TaskContext, remote: _Remote) -> Any:
        async for event in client.send_message(request, context=call):
            done, value = await self._take(event, ctx, remote)
            if done:
                return value
        if not remote.task_id:
            raise AgentFailed("the A2A agent's answer named no task and gave no message")
        return await self._poll(client, call, ctx, remote)

    async def _take(self, event: StreamResponse, ctx: TaskContext, remote: _Remote) -> tuple[bool, Any]:
        """(ended, the result) after one event of the answer."""
        kind = event.WhichOneof("payload")
        if kind == "message":
            return True, parts_result(event.message.parts)
        if kind == "task":
            remote.task_id, remote.context_id = event.task.id, event.task.context_id
            for artifact in event.task.artifacts:
                remote.take_artifact(artifact, append=False)
            return await self._status(event.task, ctx, remote)
        if kind == "artifact_update":
            remote.task_id = remote.task_id or event.artifact_update.task_id
            remote.take_artifact(event.artifact_update.artifact, event.artifact_update.append)
        elif kind == "status_update":
            update = event.status_update
            remote.task_id = remote.task_id or update.task_id
            task = Task(id=remote.task_id, context_id=update.context_id, status=update.status)
            return await self._status(task, ctx, remote)
        return False, None

    async def _status(self, task: Task, ctx: TaskContext, remote: _Remote) -> tuple[bool, Any]:
        if is_final(task.status.state):
            whole = Task()
            whole.CopyFrom(task)
            if not whole.artifacts:
                whole.artifacts.extend(remote.artifacts.values())
            return True, task_result(whole)
        if task.status.state in _WORKING and task.status.HasField("message"):
            await self._progress(task.status.message, ctx, remote)
        return False, None

    async def _progress(self, message: Message, ctx: TaskContext, remote: _Remote) -> None:
        text = message_text(message)
        fraction, extra = progress_of(message)
        seen = f"{fraction}|{text}|{sorted(extra.items())!r}"
        if seen == remote.last_status or (fraction is None and not text and not extra):
            return  # (a poll that found nothing new)
        remote.last_status = seen
        try:
            await ctx.progress(fraction, text[:1000] or None, **extra)
        except InvalidPayload as exc:  # (over a limit: the update is dropped, the task goes on)
            log.warning("progress of %s dropped: %s", ctx.task_id, exc)

    async def _poll(self, client: Client, call: ClientCallContext, ctx: TaskContext, remote: _Remote) -> Any:
        pause = POLL_FIRST_S
        while True:
            await asyncio.sleep(pause)
            task = await client.get_task(GetTaskRequest(id=remote.task_id), context=call)
            for artifact in task.artifacts:
                remote.take_artifact(artifact, append=False)
            done, value = await self._status(task, ctx, remote)
            if done:
                return value
            pause = min(pause * 2, POLL_MAX_S)

    async def _cancel_remote(self, client: Client, call: ClientCallContext, task_id: str) -> None:
        """Cancel the remote task (the attempt was canceled or timed out); best effort."""
        try:
            await asyncio.wait_for(client.cancel_task(CancelTaskRequest(id=task_id), context=call),
                                   CANCEL_TIMEOUT_S)
            log.info("canceled the A2A agent's task %s", task_id)
        except (A2AError, TimeoutError, OSError) as exc:
            log.warning("could not cancel the A2A agent's task %s: %s", task_id,
                        str(getattr(exc, "message", "") or exc)[:200])
