"""The fleet as operators see it: capabilities, agents, queues (the shapes of the CLI's --json)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from broker.ids import CAPABILITY_RE, check_capability
from broker.ops.catalog import capability_rows
from broker.ops.overview import agent_rows, queue_rows
from gateway.apikeys import KeyRecord, Role
from gateway.auth import require
from gateway.models import ErrorBody
from gateway.state import state_of

router = APIRouter(prefix="/v1", tags=["fleet"],
                   responses={code: {"model": ErrorBody} for code in (401, 403, 422, 503)})
Reader = Annotated[KeyRecord | None, Depends(require(Role.READER))]
Capability = Annotated[str | None, Query(pattern=CAPABILITY_RE.pattern.removesuffix("\\Z") + "$",
                                         description="only this capability")]


@router.get("/capabilities", summary="Capabilities, with their agents")
async def capabilities(request: Request, _: Reader) -> list[dict[str, Any]]:
    """As `reach capabilities --json`: every capability producers or agents named."""
    gw = state_of(request.app)
    return [row.as_dict() for row in await gw.in_thread(lambda r: capability_rows(r, gw.settings))]


@router.get("/agents", summary="Agents, their state and load")
async def agents(request: Request, _: Reader, capability: Capability = None) -> list[dict[str, Any]]:
    """As `reach agents --json`."""
    gw = state_of(request.app)
    if capability:
        check_capability(capability)
    return [row.as_dict() for row in await gw.in_thread(lambda r: agent_rows(r, gw.settings, capability))]


@router.get("/queues", summary="Queues per capability")
async def queues(request: Request, _: Reader, capability: Capability = None) -> list[dict[str, Any]]:
    """As `reach queues --json`."""
    gw = state_of(request.app)
    if capability:
        check_capability(capability)
    return [row.as_dict() for row in await gw.in_thread(lambda r: queue_rows(r, gw.settings, capability))]
