"""The Lua scripts of `broker/lua/`, loaded once per client and called by name.

Each script is one atomic state change and lives in its own file, opening with a comment that
lists its KEYS and ARGV. `_lib.lua` holds helpers that every script shares; it is prepended to
each script's text here. `broker/protocol.py` builds each call's keys and arguments.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.client import Redis
from redis.cluster import RedisCluster

from broker.protocol import ScriptCall

_LUA = resources.files("broker") / "lua"

# Every `<name>.lua` of the folder is a script (files starting with '_' are shared helpers).
SCRIPT_NAMES = tuple(sorted(
    entry.name.removesuffix(".lua") for entry in _LUA.iterdir()
    if entry.name.endswith(".lua") and not entry.name.startswith("_")
))


@cache
def source(name: str) -> str:
    lib = (_LUA / "_lib.lua").read_text(encoding="utf-8")
    body = (_LUA / f"{name}.lua").read_text(encoding="utf-8")
    return f"{lib}\n-- ===== {name}.lua =====\n{body}"


class Scripts:
    """Runs ScriptCalls on a synchronous client (EVALSHA, loading the script when Redis lacks it)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}

    def __call__(self, call: ScriptCall, client: Any = None) -> Any:
        return self._scripts[call.name](keys=call.keys, args=call.args, client=client)


class AsyncScripts:
    """Runs ScriptCalls on an asyncio client."""

    def __init__(self, client: AsyncRedis | AsyncRedisCluster) -> None:
        self._client = client
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}

    async def __call__(self, call: ScriptCall, client: Any = None) -> Any:
        return await self._scripts[call.name](keys=call.keys, args=call.args, client=client)

    def queue(self, call: ScriptCall, pipe: Any) -> None:
        """Queue the call on a pipeline as a bare EVALSHA: its reply is a NoScriptError if Redis
        lacks the script (then run the call alone, which loads it). redis-py's own way would
        ask Redis whether the scripts exist before every execute, one more round trip."""
        pipe.evalsha(self._scripts[call.name].sha, len(call.keys), *call.keys, *call.args)

    async def run_all(self, calls: list[ScriptCall]) -> list[Any]:
        """Run several calls in one round trip, in order, each atomic on its own (not all
        together). A call whose script Redis lacks is run again alone, which loads it. On
        Cluster, whose pipelines refuse EVALSHA, the calls go one by one."""
        if len(calls) == 1 or self._cluster:
            return [await self(call) for call in calls]
        pipe = self._client.pipeline(transaction=False)
        for call in calls:
            self.queue(call, pipe)
        replies = await pipe.execute(raise_on_error=False)
        out = []
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply = await self(call)
            elif isinstance(reply, Exception):
                raise reply
            out.append(reply)
        return out
