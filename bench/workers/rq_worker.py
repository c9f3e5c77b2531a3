"""An rq worker process: `Worker` (forks a work horse per job, rq's default) or `SimpleWorker`.

Keys carry the run's RQ_KEY_PREFIX (set by the harness in the environment). The worker is built
and connected, prints READY, and calls `work()` on GO; SIGTERM is rq's own warm shutdown.

    python -m bench.workers.rq_worker --url URL --queue NAME --kind worker|simple --name NAME
"""

from __future__ import annotations

import argparse
import sys


def main() -> None:
    from redis import Redis
    from rq import Queue, SimpleWorker, Worker

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--kind", choices=["worker", "simple"], required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    connection = Redis.from_url(args.url)
    queue = Queue(args.queue, connection=connection)
    cls = SimpleWorker if args.kind == "simple" else Worker
    worker = cls([queue], connection=connection, name=args.name)
    connection.ping()
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return
    worker.work(with_scheduler=False, logging_level="WARNING")


if __name__ == "__main__":
    main()
