"""A2A's operations, served from Reach (a2a-sdk's RequestHandler; its JSON-RPC and HTTP+JSON
routes call it). Redis holds everything, so any gateway process answers for any task.

    SendMessage            submit; wait for the end (at most SEND_WAIT_S) unless returnImmediately
    SendStreamingMessage   submit; the task, then a status update per event, until the end
    GetTask, ListTasks     the task's record and events; the index of A2A tasks (index.py)
    CancelTask             cancel wherever the task is
    SubscribeToTask        the task as of the client's position (`Last-Event-ID: <seq>`, else
                           now), then every event after it: nothing is missed or repeated
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length, validate_page_size

from broker.errors import BadInput, QueueFull, UnknownTask
from broker.protocol.submit import MAX_LABEL_LEN, SubmitOptions
from gateway.a2a import mapping
from gateway.a2a.index import BadCursor, TaskIndex
from gateway.a2a.requests import requested_capability, resume_point, submit_options
from gateway.a2a.snapshots import Snapshots
from gateway.capabilities import Capabilities, SchemaError
from gateway.errors import from_library
from gateway.follow import follow
from gateway.state import GatewayState

SEND_WAIT_S = 60.0
"""A blocking SendMessage answers after this long at most, with the task as it stands then."""


class ReachRequestHandler(RequestHandler):
    def __init__(self, gw: GatewayState, capabilities: Capabilities) -> None:
        self.gw = gw
        self.capabilities = capabilities
        self.index = TaskIndex(gw.settings, gw.redis)
        self.snapshots = Snapshots(gw)

    # -- sending ----------------------------------------------------------------------------

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        task_id = await self._submit(params, context)
        if not params.configuration.return_immediately:
            await self.gw.results.wait(task_id, SEND_WAIT_S)
        return await self._task(task_id, params.configuration)

    async def on_message_send_stream(self, params: SendMessageRequest, context: ServerCallContext
                                     ) -> AsyncGenerator[Event]:
        task_id = await self._submit(params, context)
        # (as of its first event, whatever happened since: the stream tells the whole story)
        snapshot = await self.snapshots.read(task_id, upto=1)
        if snapshot is None:
            raise TaskNotFoundError(f"task {task_id} expired")
        yield apply_history_length(snapshot.task, params.configuration)
        async for event in self._follow(snapshot):
            yield event

    async def _submit(self, params: SendMessageRequest, context: ServerCallContext) -> str:
        message = params.message
        if message.task_id:
            await self._refuse_follow_up(message.task_id)
        validate_history_length(params.configuration)
        live = [r.capability for r in await self.capabilities.live()]
        capability = requested_capability(params, context, live)
        row = await self.capabilities.find(capability)
        if row is None:
            names = ", ".join(r.capability for r in await self.capabilities.live()) or "none"
            raise InvalidParamsError(f"unknown skill {capability!r}: the skills are {names}")
        payload, from_text = mapping.payload_of(message)
        try:
            self.capabilities.check(row, payload)
        except SchemaError as exc:
            raise InvalidParamsError(f"the payload does not match the input schema of {capability!r}: "
                                     f"{exc}") from None
        context_id = message.context_id or str(uuid.uuid4())
        options = submit_options(params, context_id, {
            "message_id": message.message_id, "context_id": context_id, "text": from_text},
            _idempotency_key(context_id, message.message_id))
        return await self._enqueue(capability, payload, options, context_id)

    async def _enqueue(self, capability: str, payload: Any, options: SubmitOptions, context_id: str) -> str:
        try:
            handle = await self.gw.client.submit(capability, payload, options)
        except (BadInput, QueueFull) as exc:
            if isinstance(exc, QueueFull):
                raise InternalError(f"{exc} (try again shortly)") from None
            raise InvalidParamsError(str(exc)) from None
        except Exception as exc:
            mapped = from_library(exc)
            if mapped.status == 500:
                raise
            raise InternalError(mapped.message) from None
        if handle.created:
            await self.index.add(handle.task_id, context_id, int(time.time() * 1000))
        return handle.task_id

    async def _refuse_follow_up(self, task_id: str) -> None:
        """Reach's tasks take one message: a message naming a task is refused (A2A's
        UnsupportedOperation for an ended task; its own error for one still going)."""
        snapshot = await self.snapshots.read(task_id)
        if snapshot is None:
            raise TaskNotFoundError(f"no task {task_id}")
        if snapshot.ended:
            raise UnsupportedOperationError(f"task {task_id} has ended; send a new message without "
                                            "taskId (the same contextId keeps the conversation)")
        raise UnsupportedOperationError(f"task {task_id} is still running and takes no further input")

    # -- reading ----------------------------------------------------------------------------

    async def _task(self, task_id: str, config: Any = None) -> Task:
        snapshot = await self.snapshots.read(task_id)
        if snapshot is None:
            raise TaskNotFoundError(f"no task {task_id}")
        return apply_history_length(snapshot.task, config)

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_history_length(params)
        self._check_capability(params.id, context)
        return await self._task(params.id, params)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        validate_history_length(params)
        size = params.page_size if params.HasField("page_size") else 50
        validate_page_size(size)
        try:
            page = await self.index.page(params.context_id or None, size, params.page_token or None,
                                         params.status or None, context.state.get("capability"))
        except BadCursor as exc:
            raise InvalidParamsError(str(exc)) from None
        tasks = []
        for entry in page.entries:
            snapshot = await self.snapshots.read(entry.task_id)
            if snapshot is None:
                continue
            task = apply_history_length(snapshot.task, params)
            if not params.include_artifacts:
                task.ClearField("artifacts")
            tasks.append(task)
        return ListTasksResponse(tasks=tasks, next_page_token=page.next_token, page_size=size,
                                 total_size=page.total)

    def _check_capability(self, task_id: str, context: ServerCallContext) -> None:
        """On one capability's endpoint, a task of another is not found there."""
        capability = context.state.get("capability")
        if capability and task_id.partition(":")[0] != capability:
            raise TaskNotFoundError(f"no task {task_id} at the agent {capability!r}")

    # -- canceling --------------------------------------------------------------------------

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        self._check_capability(params.id, context)
        try:
            canceled = await self.gw.client.cancel(params.id)
        except (UnknownTask, BadInput):
            raise TaskNotFoundError(f"no task {params.id}") from None
        if not canceled:
            raise TaskNotCancelableError(f"task {params.id} has ended")
        return await self._task(params.id)

    # -- following --------------------------------------------------------------------------

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest, context: ServerCallContext
                                   ) -> AsyncGenerator[Event]:
        self._check_capability(params.id, context)
        after = resume_point(context)
        snapshot = await self.snapshots.read(params.id, upto=after)
        if snapshot is None:
            raise TaskNotFoundError(f"no task {params.id}")
        if snapshot.ended:
            raise UnsupportedOperationError(f"task {params.id} has ended: GetTask reads it")
        yield snapshot.task
        async for event in self._follow(snapshot):
            yield event

    async def _follow(self, snapshot: Any) -> AsyncGenerator[Event]:
        """The status updates of every event after the snapshot's, until the task ends."""
        gw, status = self.gw, snapshot.status
        task_id, context_id = snapshot.task.id, snapshot.task.context_id
        async for event in follow(gw.settings, gw.scripts, gw.listener, task_id, status.seq, gw.stream_reads):
            new = mapping.event_status(event, status)
            if new is None:
                continue
            status = new
            if new.state == mapping.COMPLETED:
                result = await self.snapshots.result(task_id)
                yield mapping.artifact_update(result, new.seq, task_id, context_id)
            yield mapping.status_update(new, event.type, task_id, context_id)
            if new.state in mapping.TERMINAL:
                return

    # -- what Reach does not offer -------------------------------------------------------------

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError("follow a task with SubscribeToTask instead")

    async def on_get_task_push_notification_config(
            self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
            self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _idempotency_key(context_id: str, message_id: str) -> str | None:
    """A message sent again (a client retrying) makes no second task."""
    if not message_id:
        return None
    key = f"a2a:{context_id}:{message_id}"
    return key if len(key) <= MAX_LABEL_LEN else "a2a:" + hashlib.sha256(key.encode()).hexdigest()
