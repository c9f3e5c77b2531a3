"""`python -m bench fleet`: issue 29's fleet benchmark.

A fleet of agents per system (Reach, BullMQ, Celery, dramatiq) on a fresh Redis each, fed by an
open-loop producer at about 70 % of the fleet's capacity, through five scenarios: healthy, a slow
agent, a black-hole agent, dying agents and a cold joiner. Every handler appends each execution
(task, agent, start, end, outcome) to a log file, so attempts, duplicates and "touched the bad
agent" are counted from what really ran, the same way for every system.

    workload.py   the seeded task durations, the rate, the plan a producer reads
    scenarios.py  the five scenarios: which agent misbehaves, how and when
    behaviour.py  the agent side: how long a task takes here, and the execution log
    runner.py     one system through one scenario: processes, timeline, outcomes
    metrics.py    the figures of one run; report.py the tables, the bar and the JSON
    plot.py       latency over time, one PNG per scenario
    systems/      one module per system: how its agents, helpers and producer start
    agents/       the Python agents' task code (Reach handler, Celery app, dramatiq actor)
    producers/    the Python producers (Reach, Celery, dramatiq); BullMQ's are in bench/bullmq/
"""
