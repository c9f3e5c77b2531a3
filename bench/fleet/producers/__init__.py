"""The Python producers (Reach, Celery, dramatiq); BullMQ's is bench/bullmq/fleet_producer.js.

Each one: connects, prints READY, waits for `GO <t0 ms>` on stdin, submits task i at
t0 + i / rate (open loop: never waiting for earlier tasks), notes when each outcome reaches it
through the system's own notification, and once every outcome is in (or the deadline passed)
writes `{"tasks": [[i, id, submit_ms, seen_ms, outcome], ...]}` to --out and prints
`RESULT <path>`. Times are wall-clock ms; outcome is "ok", "failed" or null (never seen).
"""
