"""A dramatiq agent: RedisBroker + Results (Redis backend), its Retries middleware on.

Retries: 3 attempts in all (max_retries=2), backoff from 500 ms doubling up to 8 s with
dramatiq's jitter, the same numbers as Reach's. Prefetch stays dramatiq's default (2 x threads).
Prints READY once its worker runs; exits on STOP or when stdin closes.

    python -m bench.fleet.agents.dramatiq_agent --url URL [--threads 4]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.fleet.behaviour import run_sync

NAMESPACE = "fleet"
QUEUE = "fleet"


def work(task: int, duration_ms: float) -> Any:
    return run_sync(task, duration_ms)


def build(url: str) -> tuple[Any, Any, Any]:
    """(broker, results backend, actor), the same in the agents and the producer."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results
    from dramatiq.results.backends.redis import RedisBackend

    broker: Any = RedisBroker(url=url, namespace=NAMESPACE)  # type: ignore[no-untyped-call]
    backend: Any = RedisBackend(url=url, namespace=f"{NAMESPACE}-results")  # type: ignore[no-untyped-call]
    broker.add_middleware(Results(backend=backend))  # type: ignore[no-untyped-call]
    declare: Any = dramatiq.actor
    actor = declare(work, actor_name="work", queue_name=QUEUE, store_results=True, broker=broker,
                    max_retries=2, min_backoff=500, max_backoff=8000)
    return broker, backend, actor


def main() -> None:
    import dramatiq

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    broker, _, _ = build(args.url)
    broker.client.ping()
    worker = dramatiq.Worker(broker, worker_threads=args.threads)
    worker.start()
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if line.strip() == "STOP":
            break
    worker.stop(timeout=5000)


if __name__ == "__main__":
    main()
