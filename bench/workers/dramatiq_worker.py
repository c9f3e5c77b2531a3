"""A dramatiq worker process: Redis broker + Results middleware (Redis backend), default threads.

The actor is the no-op `bench.workers.tasks.noop` with `store_results=True`. One extra
middleware, placed so that it runs right after Results stored the result, notes the time; it
touches no Redis, so it costs dramatiq nothing measurable.

    python -m bench.workers.dramatiq_worker --url URL --namespace NS [--threads 8]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.workers.control import Control, Span

QUEUE = "bench"
ACTOR = "noop"


def build(url: str, namespace: str) -> tuple[Any, Any, Any]:
    """(broker, results backend, actor) for one namespace, the same in producer and worker."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results
    from dramatiq.results.backends.redis import RedisBackend

    from bench.workers.tasks import noop

    broker: Any = RedisBroker(url=url, namespace=namespace)  # type: ignore[no-untyped-call]
    backend: Any = RedisBackend(url=url, namespace=f"{namespace}-results")  # type: ignore[no-untyped-call]
    broker.add_middleware(Results(backend=backend))  # type: ignore[no-untyped-call]
    declare: Any = dramatiq.actor
    actor = declare(noop, actor_name=ACTOR, queue_name=QUEUE, store_results=True, broker=broker)
    return broker, backend, actor


def main() -> None:
    import dramatiq
    from dramatiq.results import Results

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    span = Span()

    class Stamp(dramatiq.Middleware):
        def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                                  exception: Any = None) -> None:
            span.mark(time.time() * 1000)

    broker, _, _ = build(args.url, args.namespace)
    # after_* hooks run in reverse order: placed before Results, Stamp runs after it.
    broker.add_middleware(Stamp(), before=Results)
    broker.client.ping()
    control = Control(span)
    control.ready()
    control.go.wait()
    if control.stop.is_set():
        return
    worker = dramatiq.Worker(broker, worker_threads=args.threads)
    worker.start()
    control.stop.wait()
    worker.stop(timeout=5000)


if __name__ == "__main__":
    main()
