"""The raw redis-py Streams loop, the physical limit of a Redis Streams queue in Python.

XREADGROUP COUNT 100, then one pipeline per batch: the result written per task (RPUSH to a
per-task list a waiter can BLPOP, with a TTL), one XACK for the batch, a done counter and TIME
(so the batch's result-stored time is the server's, at no extra round trip).

    python -m bench.workers.raw_worker --url URL --prefix P --consumer NAME
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from bench.workers.control import Control, Span

GROUP = "g"
BATCH = 100
RESULT_TTL_MS = 86_400_000


def keys(prefix: str) -> tuple[str, str]:
    """(stream, done counter) of a namespace."""
    return f"{prefix}:stream", f"{prefix}:done"


def result_key(prefix: str, entry_id: str) -> str:
    return f"{prefix}:res:{entry_id}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--consumer", required=True)
    args = parser.parse_args()
    r: Any = redis.Redis.from_url(args.url)
    stream, done = keys(args.prefix)
    res_prefix = f"{args.prefix}:res:".encode()
    span = Span()
    control = Control(span)
    r.ping()
    control.ready()
    control.go.wait()
    while not control.stop.is_set():
        reply = r.xreadgroup(GROUP, args.consumer, {stream: ">"}, count=BATCH, block=100)
        if not reply:
            continue
        entries = reply[0][1]
        pipe = r.pipeline(transaction=False)
        ids = []
        for entry_id, fields in entries:
            key = res_prefix + entry_id
            pipe.rpush(key, fields[b"d"])
            pipe.pexpire(key, RESULT_TTL_MS)
            ids.append(entry_id)
        pipe.xack(stream, GROUP, *ids)
        pipe.incrby(done, len(ids))
        pipe.time()
        seconds, micros = pipe.execute()[-1]
        span.mark(seconds * 1000 + micros / 1000, len(ids))


if __name__ == "__main__":
    main()
