"""The gateway's A2A server against the official SDK's client (a2a-sdk), over real HTTP to real
`reach serve` processes (a dispatcher and a worker behind them): send, stream, get, list,
cancel, resubscribe across gateway processes, failures, bad input and API keys."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a", reason="the a2a extra is not installed")

from a2a.client import A2AClientError, Client, ClientCallContext, ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from broker import ReachClient
from broker.codec import whole_numbers
from gateway.apikeys import Role as KeyRole
from gateway.apikeys import create_key, revoke_key
from tests.conftest import settings_env, sync_redis, wait_until
from tests.protocol_stack import ECHO, LONG, Stack, protocol_stack

pytestmark = pytest.mark.one_redis


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with protocol_stack(redis_url, tmp_path_factory.mktemp("a2a"), gateways=2) as s:
        yield s


def data_message(payload: Any, **fields: Any) -> Message:
    value = Value()
    ParseDict(payload, value)
    return Message(message_id=secrets.token_hex(8), role=Role.ROLE_USER, parts=[Part(data=value)], **fields)


async def client_for(url: str, http: httpx.AsyncClient, rest: bool = False) -> Client:
    bindings = [TransportProtocol.HTTP_JSON] if rest else [TransportProtocol.JSONRPC]
    return await create_client(url, ClientConfig(httpx_client=http, supported_protocol_bindings=bindings,
                                                 use_client_preference=True))


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def seq_of(event: StreamResponse) -> int:
    kind = event.WhichOneof("payload")
    meta = whole_numbers(MessageToDict(getattr(event, kind).metadata))
    return int(meta["reach"]["seq"])


def reach_seqs(stack: Stack, task_id: str) -> list[int]:
    """The seqs of the task's events that A2A shows (a status update each)."""
    shown = {"accepted", "progress", "succeeded", "failed", "canceled"}
    with ReachClient(stack.settings) as client:
        return [e.seq for e in client.get(task_id).events(timeout=10) if e.type in shown]


# -- cards ----------------------------------------------------------------------------------

async def test_the_fleet_card_lists_every_live_capability_as_a_skill(stack: Stack,
                                                                    http: httpx.AsyncClient) -> None:
    card = (await http.get(f"{stack.url}/.well-known/agent-card.json")).json()
    skills = {s["id"]: s for s in card["skills"]}
    assert {LONG, ECHO} <= set(skills)
    assert skills[LONG]["description"].startswith("A long task")
    assert skills[ECHO]["description"] == "Answers its payload unchanged"
    assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == ["JSONRPC", "HTTP+JSON"]
    assert card["capabilities"]["streaming"] is True
    schemas = card["capabilities"]["extensions"][0]["params"]
    assert schemas[LONG]["input_schema"]["additionalProperties"] is False
    assert "securitySchemes" not in card  # (a loopback gateway with no key made: none needed)
    one = (await http.get(f"{stack.url}/a2a/agents/{LONG}/.well-known/agent-card.json")).json()
    assert [s["id"] for s in one["skills"]] == [LONG]
    assert one["supportedInterfaces"][0]["url"] == f"{stack.url}/a2a/agents/{LONG}"
    missing = await http.get(f"{stack.url}/a2a/agents/nosuch/.well-known/agent-card.json")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


# -- sending and streaming ------------------------------------------------------------------

async def test_send_waits_for_the_result_and_a_text_part_is_a_text_payload(stack: Stack,
                                                                          http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{ECHO}", http)
    message = Message(message_id=secrets.token_hex(8), role=Role.ROLE_USER, parts=[Part(text="hello")],
                      context_id="conv-1")
    config = ClientConfig(httpx_client=http, streaming=False)
    blocking = await create_client(f"{stack.url}/a2a/agents/{ECHO}", config)
    (event,) = [e async for e in blocking.send_message(SendMessageRequest(message=message))]
    task = event.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert whole_numbers(MessageToDict(task.artifacts[0].parts[0].data)) == {"text": "hello"}
    assert task.context_id == "conv-1" and task.history[0].parts[0].text == "hello"
    with ReachClient(stack.settings) as reach:
        assert reach.get(task.id).status().session_id == "conv-1"  # (contextId is the session)
    again = await client.get_task(GetTaskRequest(id=task.id))
    assert again.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_stream_has_the_task_then_a_status_update_per_event_then_the_result(
        stack: Stack, http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a", http)
    request = SendMessageRequest(message=data_message({"steps": 3, "step_ms": 20, "echo": "s"}),
                                 metadata=_struct({"skill": LONG}))
    events = [e async for e in client.send_message(request)]
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and kinds[-2:] == ["artifact_update", "status_update"]
    assert events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    updates = [e.status_update for e in events if e.HasField("status_update")]
    working, completed = TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_COMPLETED
    assert [u.status.state for u in updates] == [working] * 4 + [completed]
    assert [u.status.message.parts[0].text for u in updates[1:4]] == [f"step {i} of 3" for i in (1, 2, 3)]
    progress = whole_numbers(MessageToDict(updates[1].status.message.parts[1].data))
    assert progress == {"progress": 0.25, "message": "step 1 of 3", "step": 1}
    result = whole_numbers(MessageToDict(events[-2].artifact_update.artifact.parts[0].data))
    assert result == {"echo": "s", "steps": 3}
    task_id = events[0].task.id
    assert [seq_of(e) for e in events if e.HasField("status_update")] == reach_seqs(stack, task_id)


async def test_the_http_json_binding_sends_and_reads(stack: Stack, http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{LONG}", http, rest=True)
    request = SendMessageRequest(message=data_message({"echo": "rest"}))
    events = [e async for e in client.send_message(request)]
    task_id = events[0].task.id
    task = await client.get_task(GetTaskRequest(id=task_id))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert whole_numbers(MessageToDict(task.artifacts[0].parts[0].data)) == {"echo": "rest", "steps": 0}


# -- failures -------------------------------------------------------------------------------

@pytest.mark.parametrize(("payload", "state", "text"), [
    ({"fail": "disk on fire"}, TaskState.TASK_STATE_FAILED, "failure: RuntimeError: disk on fire"),
    ({"invalid": "no such city"}, TaskState.TASK_STATE_REJECTED,
     "invalid_request: InvalidRequest: no such city"),
])
async def test_a_failed_task_fails_and_an_invalid_request_is_rejected(
        stack: Stack, http: httpx.AsyncClient, payload: dict[str, Any], state: int, text: str) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
    events = [e async for e in client.send_message(SendMessageRequest(message=data_message(payload)))]
    final = events[-1].status_update.status
    assert final.state == state
    assert final.message.parts[0].text == text


# -- reading --------------------------------------------------------------------------------

async def test_get_and_list_tasks_by_context_state_and_page(stack: Stack, http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
    context_id = f"ctx-{secrets.token_hex(4)}"
    ids = []
    for i in range(5):
        payload = {"echo": str(i)} if i != 2 else {"fail": "no"}
        request = SendMessageRequest(message=data_message(payload, context_id=context_id))
        events = [e async for e in client.send_message(request)]
        ids.append(events[0].task.id)
    listed = await client.list_tasks(ListTasksRequest(context_id=context_id, page_size=2))
    assert [t.id for t in listed.tasks] == ids[::-1][:2] and listed.total_size == 5
    assert not listed.tasks[0].artifacts  # (include_artifacts not asked)
    rest = await client.list_tasks(ListTasksRequest(
        context_id=context_id, page_size=10, page_token=listed.next_page_token, include_artifacts=True))
    assert [t.id for t in rest.tasks] == ids[::-1][2:] and rest.next_page_token == ""
    failed = await client.list_tasks(ListTasksRequest(context_id=context_id,
                                                      status=TaskState.TASK_STATE_FAILED))
    assert [t.id for t in failed.tasks] == [ids[2]] and failed.total_size == 1
    with pytest.raises(TaskNotFoundError):
        await client.get_task(GetTaskRequest(id=f"{LONG}:01JB0000000000000000000000"))
    with pytest.raises(TaskNotFoundError):  # (a task of another capability is not at this agent)
        await client.get_task(GetTaskRequest(id=f"{ECHO}:01JB0000000000000000000000"))


# -- canceling ------------------------------------------------------------------------------

async def test_cancel_stops_a_running_task(stack: Stack, http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
    request = SendMessageRequest(message=data_message({"steps": 200, "step_ms": 50}),
                                 configuration=SendMessageConfiguration(return_immediately=True))
    stream = client.send_message(request)
    task_id = ""
    async for event in stream:
        task_id = task_id or event.task.id
        text = event.status_update.status.message.parts[0].text if event.HasField("status_update") else ""
        if text.startswith("step"):
            break  # (it runs)
    await stream.aclose()
    canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task_id))
    with pytest.raises(UnsupportedOperationError):  # (an ended task has nothing more to stream)
        [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
    with ReachClient(stack.settings) as reach:
        assert reach.get(task_id).status().state.value == "canceled"


# -- resubscribing --------------------------------------------------------------------------

async def test_a_stream_dropped_midway_resumes_on_another_gateway_missing_and_repeating_nothing(
        stack: Stack, http: httpx.AsyncClient) -> None:
    """The issue's long task (30 s with progress), here 25 steps 120 ms apart: the first stream is
    dropped after a few progress events; SubscribeToTask on another gateway process, from the
    last event seen, gets the task as of that event and then every later one."""
    first = await client_for(f"{stack.urls[0]}/a2a/agents/{LONG}", http)
    stream = first.send_message(SendMessageRequest(message=data_message({"steps": 25, "step_ms": 120})))
    seen: list[int] = []
    task_id = ""
    async for event in stream:
        task_id = task_id or event.task.id
        if event.HasField("status_update"):
            seen.append(seq_of(event))
            if len(seen) == 4:
                break
    await stream.aclose()  # (the connection drops)
    second = await client_for(f"{stack.urls[1]}/a2a/agents/{LONG}", http)
    resumed = second.subscribe(SubscribeToTaskRequest(id=task_id),
                               context=ClientCallContext(service_parameters={"Last-Event-ID": str(seen[-1])}))
    events = [e async for e in resumed]
    snapshot = events[0].task
    assert whole_numbers(MessageToDict(snapshot.metadata))["reach"]["seq"] == seen[-1]
    assert snapshot.status.message.parts[0].text == "step 3 of 25"  # (as of the last event seen)
    later = [seq_of(e) for e in events[1:] if e.HasField("status_update")]
    assert seen + later == reach_seqs(stack, task_id)  # (nothing lost, nothing twice)
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_subscribing_without_a_position_starts_from_now(stack: Stack, http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
    request = SendMessageRequest(message=data_message({"steps": 6, "step_ms": 100}),
                                 configuration=SendMessageConfiguration(return_immediately=True))
    (sent,) = [e async for e in (await create_client(f"{stack.url}/a2a/agents/{LONG}", ClientConfig(
        httpx_client=http, streaming=False))).send_message(request)]
    events = [e async for e in client.subscribe(SubscribeToTaskRequest(id=sent.task.id))]
    assert events[0].HasField("task")
    later = [seq_of(e) for e in events[1:] if e.HasField("status_update")]
    assert later == [s for s in reach_seqs(stack, sent.task.id) if s > seq_of_task(events[0])]


def seq_of_task(event: StreamResponse) -> int:
    return int(whole_numbers(MessageToDict(event.task.metadata))["reach"]["seq"])


# -- bad input: the protocol's error, and nothing enqueued ----------------------------------

async def test_bad_messages_get_the_protocols_errors_and_enqueue_nothing(stack: Stack,
                                                                        http: httpx.AsyncClient) -> None:
    one = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
    fleet = await client_for(f"{stack.url}/a2a", http)
    before = stack.task_records(LONG)
    empty = Message(message_id="e1", role=Role.ROLE_USER)
    file_only = Message(message_id="f1", role=Role.ROLE_USER, parts=[Part(url="https://example.invalid/a.pdf")])
    cases: list[tuple[Client, SendMessageRequest, type[Exception], str]] = [
        (one, SendMessageRequest(message=empty), InvalidParamsError, "no parts"),
        (one, SendMessageRequest(message=file_only), ContentTypeNotSupportedError, "no data or text part"),
        (one, SendMessageRequest(message=data_message({"steps": "many"})), InvalidParamsError, "schema"),
        (one, SendMessageRequest(message=data_message({"colour": "red"})), InvalidParamsError, "schema"),
        (fleet, SendMessageRequest(message=data_message({})), InvalidParamsError, "name the skill"),
        (fleet, SendMessageRequest(message=data_message({}), metadata=_struct({"skill": "nosuch"})),
         InvalidParamsError, "unknown skill 'nosuch'"),
    ]
    for client, request, error, text in cases:
        with pytest.raises(error, match=text):
            [e async for e in client.send_message(request)]
    assert stack.task_records(LONG) == before


async def test_a_message_for_an_ended_task_is_refused(stack: Stack, http: httpx.AsyncClient) -> None:
    client = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
    events = [e async for e in client.send_message(SendMessageRequest(message=data_message({})))]
    follow_up = data_message({}, task_id=events[0].task.id)
    with pytest.raises(UnsupportedOperationError, match="has ended"):
        [e async for e in client.send_message(SendMessageRequest(message=follow_up))]


# -- API keys -------------------------------------------------------------------------------

async def test_keys_guard_a2a_and_the_card_says_so(stack: Stack, http: httpx.AsyncClient) -> None:
    redis = sync_redis(stack.settings.redis_url)
    producer, producer_record = create_key(redis, stack.settings, KeyRole.PRODUCER)
    reader, reader_record = create_key(redis, stack.settings, KeyRole.READER)
    try:
        card = (await http.get(f"{stack.url}/.well-known/agent-card.json")).json()
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
        anonymous = await client_for(f"{stack.url}/a2a/agents/{LONG}", http)
        with pytest.raises(A2AClientError, match="401"):
            [e async for e in anonymous.send_message(SendMessageRequest(message=data_message({})))]
        async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {producer}"}) as keyed:
            sent = [e async for e in (await client_for(f"{stack.url}/a2a/agents/{LONG}", keyed)).send_message(
                SendMessageRequest(message=data_message({"echo": "k"})))]
        async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {reader}"}) as reading:
            client = await client_for(f"{stack.url}/a2a/agents/{LONG}", reading)
            assert (await client.get_task(GetTaskRequest(id=sent[0].task.id))).id == sent[0].task.id
            with pytest.raises(A2AClientError, match="403"):
                [e async for e in client.send_message(SendMessageRequest(message=data_message({})))]
    finally:
        revoke_key(redis, stack.settings, producer_record.id)
        revoke_key(redis, stack.settings, reader_record.id)
        redis.close()
        card_url = f"{stack.url}/.well-known/agent-card.json"
        wait_until(lambda: "securitySchemes" not in httpx.get(card_url).json(), 10,
                   message="the gateway to forget the keys")


def _struct(value: dict[str, Any]) -> Any:
    from google.protobuf.struct_pb2 import Struct

    struct = Struct()
    struct.update(value)
    return struct


def test_no_path_of_the_a2a_app_shadows_the_rest_of_the_gateway(stack: Stack) -> None:
    """The HTTP+JSON routes mount a `/{tenant}` catch-all: confined under /a2a, /v1 still answers,
    and says what `reach capabilities --json` says."""
    reply = httpx.get(f"{stack.url}/v1/capabilities", timeout=10)
    assert reply.status_code == 200
    described = {row["capability"]: row for row in reply.json()}
    assert described[ECHO]["description"] == "Answers its payload unchanged"
    assert described[LONG]["input_schema"]["title"] == "LongJob"
    cli = subprocess.run([sys.executable, "-m", "reach_cli", "capabilities", "--json"], capture_output=True,
                         text=True, timeout=30, env=settings_env(stack.settings), check=True)
    assert {row["capability"]: row for row in json.loads(cli.stdout)} == described


def test_the_readmes_curl_works_without_the_sdk(stack: Stack) -> None:
    """Plain JSON-RPC over HTTP, as README.md shows it with curl."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m1", "role": "ROLE_USER",
        "parts": [{"data": {"text": "One. Two. Three.", "max_sentences": 1}}]}}}
    reply = httpx.post(f"{stack.url}/a2a/agents/summarize", json=body, headers={"A2A-Version": "1.0"},
                       timeout=30).json()
    task = reply["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["data"]["summary"] in ("One.", "Two.", "Three.")
