"""An A2A agent built with the official SDK (a2a-sdk's server pieces), run as a process by the
tests of `reach-worker --a2a`: what an agent elsewhere looks like.

    python -m tests.a2a_remote_agent [--no-streaming] [--port 0]

Skills: `shout` (text in, the text upper-cased out), `count` (data {"steps", "step_ms"}: a
progress update per step, then {"counted": steps}; cancelable), `explode` (fails), `refuse`
(rejects). It prints `listening on URL` once it serves; the tasks it saw canceled are at
GET /canceled.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvicorn
from a2a.helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, Role
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

CANCELED: list[str] = []


def data_part(value: object) -> Part:
    target = Value()
    ParseDict(value, target)
    return Part(data=target)


class Executor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(message))
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        skill = MessageToDict(message.metadata).get("skill")
        await updater.start_work()
        if skill == "shout":
            text = " ".join(p.text for p in message.parts if p.WhichOneof("content") == "text")
            await updater.add_artifact([Part(text=text.upper())], name="shouted")
            await updater.complete()
        elif skill == "count":
            data = next(MessageToDict(p.data) for p in message.parts if p.WhichOneof("content") == "data")
            steps = int(data.get("steps", 1))
            for i in range(steps):
                await asyncio.sleep(float(data.get("step_ms", 0)) / 1000)
                status = new_text_message(f"counted {i + 1}", role=Role.ROLE_AGENT)
                status.parts.append(data_part({"progress": (i + 1) / (steps + 1), "i": i + 1}))
                await updater.start_work(status)
            await updater.add_artifact([data_part({"counted": steps})], name="count")
            await updater.complete()
        elif skill == "explode":
            await updater.failed(new_text_message("the reactor exploded", role=Role.ROLE_AGENT))
        else:
            await updater.reject(new_text_message(f"no skill {skill!r} here", role=Role.ROLE_AGENT))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        CANCELED.append(context.task_id or "")
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.cancel()


def card(url: str, streaming: bool) -> AgentCard:
    def skill(name: str, description: str) -> AgentSkill:
        return AgentSkill(id=name, name=name, description=description, tags=["test"],
                          examples=[f"{name} it"], input_modes=["text/plain"], output_modes=["text/plain"])

    return AgentCard(
        name="remote test agent", description="An agent elsewhere, speaking A2A", version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[skill("shout", "Upper-cases a text"), skill("count", "Counts, slowly, telling each step"),
                skill("explode", "Always fails"), skill("refuse", "Always rejects")])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-streaming", action="store_true")
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    agent_card = card(url, streaming=not args.no_streaming)
    handler = DefaultRequestHandler(agent_executor=Executor(), task_store=InMemoryTaskStore(),
                                    agent_card=agent_card)

    async def canceled(request: Request) -> JSONResponse:
        return JSONResponse(CANCELED)

    app = Starlette(routes=[*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler, "/"),
                            Route("/canceled", canceled)])
    print(f"listening on {url}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
