"""Stands in for a fleet of agents while the dispatcher is measured: drains their inboxes.

For every inbox (one per simulated agent) it reads new entries through the `agents` group and,
in one small script per inbox, acknowledges and deletes them and publishes the same
`free <cap> <agent> <len> <pending>` wake-up that Reach's complete script sends, so the
dispatcher sees the capacity come back exactly as with real workers. It runs no tasks: the
dispatcher is what is measured.

    python -m bench.workers.sim_consumer --url URL --prefix P --cap sim --agents 100
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from bench.workers.control import Control, Span
from broker.keys import AGENT_GROUP, CapabilityKeys, Channels

FREE = """
redis.call('XACK', KEYS[1], 'agents', unpack(ARGV, 4))
redis.call('XDEL', KEYS[1], unpack(ARGV, 4))
local len = redis.call('XLEN', KEYS[1])
local pending = redis.call('XPENDING', KEYS[1], 'agents')[1]
redis.call('PUBLISH', ARGV[1], 'free ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. len .. ' ' .. pending)
return len
"""


def agent_ids(count: int) -> list[str]:
    return [f"sim-{i:05d}" for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--cap", required=True)
    parser.add_argument("--agents", type=int, required=True)
    args = parser.parse_args()
    r: Any = redis.Redis.from_url(args.url, decode_responses=True)
    keys = CapabilityKeys(args.prefix, args.cap)
    wake = Channels(args.prefix).wake
    streams = {keys.inbox(agent): ">" for agent in agent_ids(args.agents)}
    free = r.register_script(FREE)
    span = Span()
    control = Control(span)
    r.ping()
    control.ready()
    control.go.wait()
    while not control.stop.is_set():
        reply = r.xreadgroup(AGENT_GROUP, "sim", streams, count=200, block=100)
        if not reply:
            continue
        pipe = r.pipeline(transaction=False)
        total = 0
        for stream, entries in reply:
            ids = [entry_id for entry_id, _ in entries]
            agent = stream.rsplit(":inbox:", 1)[1]
            free(keys=[stream], args=[wake, args.cap, agent, *ids], client=pipe)
            total += len(ids)
        pipe.execute()
        span.mark(0, total)


if __name__ == "__main__":
    main()
