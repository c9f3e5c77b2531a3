"""An LLM-style client reaching Reach's `summarize` agent two ways: as an MCP tool (what an LLM
host such as a desktop assistant calls) and as an A2A agent (what another agent talks to).

    pip install 'agent-reach[a2a,mcp]'
    reach up                      # Redis, a dispatcher, summarize workers, the gateway
    python examples/agent-protocols/summarize_client.py http://127.0.0.1:8080

Like an LLM, it picks its tool by reading the tools' descriptions, and it never learns which
process did the work.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageRequest
from google.protobuf.json_format import MessageToDict
from mcp import Client

TEXT = ("Agent-Reach makes every agent of a fleet reachable by capability. It routes each task to "
        "the best agent, renews leases, retries with backoff and parks what fails in a dead-letter "
        "stream. Producers never learn which process did the work. It speaks A2A and MCP.")


async def through_mcp(gateway: str) -> str:
    async with Client(f"{gateway}/mcp") as mcp:
        tools = (await mcp.list_tools()).tools
        tool = next(t for t in tools if "summar" in (t.description or "").lower())  # (the model's pick)
        result = await mcp.call_tool(tool.name, {"text": TEXT, "max_sentences": 1},
                                     progress_callback=lambda done, total, note: print(f"  mcp: {note}"))
        return str((result.structured_content or {})["summary"])


async def through_a2a(gateway: str) -> str:
    async with httpx.AsyncClient(timeout=60) as http:
        agent = await create_client(f"{gateway}/a2a/agents/summarize", ClientConfig(httpx_client=http))
        message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=TEXT)])
        async for event in agent.send_message(SendMessageRequest(message=message)):
            if event.HasField("status_update") and event.status_update.status.message.parts:
                print(f"  a2a: {event.status_update.status.message.parts[0].text}")
            if event.HasField("artifact_update"):
                return str(MessageToDict(event.artifact_update.artifact.parts[0].data)["summary"])
    raise RuntimeError("the task ended without a result")


async def main(gateway: str) -> None:
    print("MCP ->", await through_mcp(gateway))
    print("A2A ->", await through_a2a(gateway))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"))
