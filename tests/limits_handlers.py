"""Handlers for the limits tests, run inside real `reach-worker` processes."""

from __future__ import annotations

from typing import Any

from agent_worker import TaskContext


def big_result(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    """A result of about payload['size'] bytes of JSON."""
    return {"text": "x" * int(payload["size"])}


def deep_result(ctx: TaskContext, payload: dict[str, Any]) -> Any:
    """A result nested payload['depth'] levels deep."""
    value: Any = []
    for _ in range(int(payload["depth"]) - 1):
        value = [value]
    return value


async def chatty(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    """payload['n'] progress events, then a result."""
    for i in range(int(payload["n"])):
        await ctx.progress(message=f"step {i}", step=i)
    return {"steps": payload["n"]}


async def loud_progress(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
    """A progress message of payload['size'] characters (and one nested payload['depth'] deep):
    returns what each refusal said (None when it was taken)."""
    refused: dict[str, Any] = {"size": None, "depth": None}
    try:
        await ctx.progress(message="m" * int(payload["size"]))
    except ValueError as exc:
        refused["size"] = str(exc)
    nested: Any = {}  # (with the report's own object around it: payload['depth'] levels)
    for _ in range(int(payload.get("depth", 2)) - 2):
        nested = {"n": nested}
    try:
        await ctx.progress(0.5, "nested", detail=nested)
    except ValueError as exc:
        refused["depth"] = str(exc)
    return refused


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload
