"""Celery's producer: `apply_async` with the task id `t<i>`; outcomes from the result backend.

The Redis result backend publishes every stored state on the channel `celery-task-meta-<id>`,
which is what `AsyncResult.get()` subscribes to; one PSUBSCRIBE on that pattern sees them all.
A RETRY state is not an outcome; SUCCESS and FAILURE are.

    FLEET_REDIS_URL=URL python -m bench.fleet.producers.celery_producer --url URL --plan F --out F
"""

from __future__ import annotations

import json
import threading
from typing import Any

import redis

from bench.fleet.producers.common import Book, arguments, now_ms, pace, plan, wait_go

PATTERN = "celery-task-meta-*"


def watch(pubsub: Any, book: Book) -> None:
    for message in pubsub.listen():
        if message.get("type") != "pmessage":
            continue
        try:
            meta = json.loads(message["data"])
            status, task_id = meta["status"], str(meta["task_id"])
        except (ValueError, KeyError, TypeError):
            continue
        if status in ("SUCCESS", "FAILURE") and task_id.startswith("t"):
            book.see(int(task_id[1:]), status == "SUCCESS")


def main() -> None:
    from bench.fleet.agents.celery_app import work

    args = arguments()
    rate, durations = plan(args)
    book = Book(len(durations))
    pubsub = redis.Redis.from_url(args.url, decode_responses=True).pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe(PATTERN)
    threading.Thread(target=watch, args=(pubsub, book), daemon=True).start()
    work.app.connection_for_write().ensure_connection(max_retries=3)
    t0 = wait_go()
    for i, duration in enumerate(durations):
        pace(t0, i, rate)
        at = now_ms()
        work.apply_async((i, duration), task_id=f"t{i}")
        book.submit(i, f"t{i}", at)
    book.done.wait(max(1.0, t0 / 1000 + len(durations) / rate + args.deadline_s - now_ms() / 1000))
    book.write(args.out)


if __name__ == "__main__":
    main()
