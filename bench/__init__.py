"""The benchmark harness of issue 7: Reach against BullMQ, dramatiq, rq and a raw Streams loop.

`python -m bench` runs every row on one Redis it starts itself (or `REDIS_URL`) and writes a
table, JSON and a plot to `bench/results/`; `python -m bench --smoke` is the tiny run CI keeps
alive. Methodology and the latest full run: docs/benchmarks.md.
"""
