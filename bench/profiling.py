"""`--profile`: where Reach's time goes, after the measured figures (never during them).

1. A two-worker drain of `n` tasks and `rt_n` round trips on one worker, with py-spy recording
   every worker and the dispatcher (`--nonblocking`, so the targets are never paused): a
   flame graph (SVG) and collapsed stacks per process, and the top functions by own and by
   inclusive samples.
2. Redis time per script and per task: SLOWLOG with a 0 µs threshold during a drain (only on the
   harness's own Redis, since it changes CONFIG), attributed to each script by its SHA.
3. Redis calls per round trip and process: MONITOR during a few round trips, each client
   connection mapped to the process that owns it through /proc.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench.context import Bench
from bench.procs import ROOT, Proc
from bench.rows.base import Workers, payload
from bench.rows.reach import CAPABILITY, ReachRow
from broker.scripts import SCRIPT_NAMES, source


def py_spy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = Path(sys.executable).with_name("py-spy")
    return str(candidate) if candidate.exists() else None


class Recorder:
    """py-spy record on several processes at once; stopped with SIGINT (it then writes)."""

    def __init__(self, exe: str, out_dir: Path, label: str, procs: list[Proc], rate: int = 250) -> None:
        self.children: list[tuple[subprocess.Popen[bytes], Path]] = []
        out_dir.mkdir(parents=True, exist_ok=True)
        for proc in procs:
            role = proc.name.split("-")[1] if "-" in proc.name else proc.name
            stem = out_dir / f"{label}-{role}-{proc.pid}"
            for fmt, path in (("raw", stem.with_suffix(".txt")), ("flamegraph", stem.with_suffix(".svg"))):
                child = subprocess.Popen(
                    [exe, "record", "--pid", str(proc.pid), "--rate", str(rate), "--nonblocking",
                     "--format", fmt, "--output", str(path)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.children.append((child, path))

    def stop(self) -> list[Path]:
        for child, _ in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGINT)
        out = []
        for child, path in self.children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)
            if path.exists():
                out.append(path)
        return out


IDLE_LEAVES = ("select (selectors.py)", "EpollSelector.select", "Condition.wait", "Event.wait",
               "_wait_for_tstate_lock", "sleep (", "poll (", "wait (threading.py)", "readinto (socket.py)")
OUR_CODE = ("broker/", "agent_worker/", "dispatcher/", "reach_cli/")
# Frames every busy sample of a process passes through (entry points, the event loop itself).
ENTRY_FRAMES = ("<frozen runpy>", "typer/", "_click/", "click/", "asyncio/runners.py",
                "run_forever (", "run_until_complete (", "_run_once (", "Handle._run (",
                "reach_cli/main.py", "reach_cli/__main__.py", "reach_cli/worker.py",
                "reach_cli/common.py", "Thread.run (", "Thread._bootstrap")


def top_functions(collapsed: Path, limit: int = 15) -> dict[str, Any]:
    """Busy share and the functions that take it, from py-spy's collapsed stacks.

    Samples whose innermost frame is a wait (the event loop's epoll, a condition or event, a
    sleep) count as idle: py-spy's own idle detection does not work in every container, so it
    is done here. `own_pct` is the share of busy samples with the function innermost;
    `inclusive_pct` the share with it anywhere on the stack, for Reach's own code and for
    everything else (redis-py, asyncio, ...) separately.
    """
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    theirs: Counter[str] = Counter()
    total = busy = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # py-spy may start stacks with "process ..." / "thread ..." frames: keep code frames.
        frames = [_short(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        if any(marker in frames[-1] for marker in IDLE_LEAVES):
            continue
        busy += count
        own[frames[-1]] += count
        for frame in set(frames):
            if any(entry in frame for entry in ENTRY_FRAMES):
                continue
            (ours if any(code in frame for code in OUR_CODE) else theirs)[frame] += count

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * c / busy, 1)) for name, c in counter.most_common(limit)] if busy else []

    return {"samples": total, "busy_pct": round(100 * busy / total, 1) if total else None,
            "own_pct": share(own), "inclusive_reach_pct": share(ours),
            "inclusive_other_pct": share(theirs)}


def _short(frame: str) -> str:
    """'func (/abs/path/pkg/file.py:12)' -> 'func (pkg/file.py)', so lines of one function add up."""
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rstrip(")")
    if "site-packages/" in file:
        file = file.split("site-packages/", 1)[1]
    elif file.startswith(str(ROOT)):
        file = file[len(str(ROOT)) + 1:]
    else:
        file = "/".join(Path(file).parts[-2:])
    return f"{name} ({file})"


# -- per-process Redis connections ------------------------------------------------------------


def _socket_ports() -> dict[str, int]:
    """Socket inode -> local TCP port, for every TCP socket on the machine."""
    out: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                out[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return out


def ports_of(pid: int) -> set[int]:
    """Local TCP ports of the sockets process `pid` holds."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    table = _socket_ports()
    return {table[i] for i in inodes if i in table}


def monitor_round_trips(bench: Bench, row: ReachRow, ws: Workers, n: int) -> dict[str, Any]:
    """Redis calls per round trip: client calls by process, and commands run inside scripts."""
    owners = {"producer (this process)": ports_of(os.getpid())}
    for proc in ws.all:
        owners[proc.name.split("-")[1]] = ports_of(proc.pid)
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    marker = f"bench-monitor-end-{bench.tag}"

    def listen() -> None:
        conn: Any = redis.Redis.from_url(bench.url, decode_responses=True)
        with conn.monitor() as m:
            ready.set()
            for command in m.listen():
                if marker in command.get("command", ""):
                    return
                seen.append(command)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)
    assert row.client is not None
    start = time.monotonic()
    for i in range(n):
        row.client.submit(CAPABILITY, payload(i)).result(timeout=30)
    elapsed = time.monotonic() - start
    bench.target.r.echo(marker)
    thread.join(10)
    by_owner: dict[str, Counter[str]] = {}
    inside: Counter[str] = Counter()
    for command in seen:
        name = command["command"].split(" ", 1)[0].strip('"').upper()
        if command.get("client_type") == "lua":
            inside[name] += 1
            continue
        port = int(command.get("client_port") or 0)
        owner = next((o for o, ports in owners.items() if port in ports), "other")
        by_owner.setdefault(owner, Counter())[name] += 1
    return {
        "round_trips": n,
        "seconds": round(elapsed, 3),
        "client_calls_per_task": {o: {k: round(v / n, 2) for k, v in c.most_common()}
                                  for o, c in by_owner.items()},
        "client_calls_total_per_task": round(sum(sum(c.values()) for c in by_owner.values()) / n, 2),
        "commands_inside_scripts_per_task": {k: round(v / n, 2) for k, v in inside.most_common()},
    }


# -- Redis time per script ---------------------------------------------------------------------


def slowlog_scripts(bench: Bench, run: Any) -> dict[str, Any] | None:
    """Run `run()` with SLOWLOG catching every command; Redis µs per script (total and per call)."""
    if not bench.target.owned:
        return None
    r = bench.target.r
    shas = {hashlib.sha1(source(name).encode()).hexdigest(): name for name in SCRIPT_NAMES}
    old = r.config_get("slowlog-*")
    r.config_set("slowlog-max-len", 1_000_000)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    try:
        tasks = run()
        entries = r.slowlog_get(1_000_000)
    finally:
        for key, value in old.items():
            r.config_set(key, value)
        r.slowlog_reset()
    per: dict[str, dict[str, float]] = {}
    for entry in entries:
        command = entry.get("command", "")
        if isinstance(command, bytes):
            command = command.decode(errors="replace")
        parts = command.split(" ")
        name = parts[0].lower()
        if name == "evalsha" and len(parts) > 1:
            name = "script " + shas.get(parts[1], parts[1][:8])
        slot = per.setdefault(name, {"calls": 0, "usec": 0})
        slot["calls"] += 1
        slot["usec"] += int(entry.get("duration", 0))
    ordered = sorted(per.items(), key=lambda kv: -kv[1]["usec"])
    return {
        "tasks": tasks,
        "by_command": {k: {"calls": int(v["calls"]), "usec_per_call": round(v["usec"] / v["calls"], 1),
                           "usec_per_task": round(v["usec"] / tasks, 1)} for k, v in ordered[:15]},
        "note": "SLOWLOG truncates argument lists; durations exclude network and queueing",
    }


# -- the whole pass ----------------------------------------------------------------------------


def run(bench: Bench, out_dir: Path) -> dict[str, Any]:
    exe = py_spy()
    result: dict[str, Any] = {"dir": str(out_dir)}
    if exe is None:
        result["note"] = "py-spy is not installed (pip install py-spy): no stack profiles"
    row = ReachRow(bench)
    row.prepare()
    n, rt_n = bench.sizes.n, bench.sizes.rt_n

    # Drain with two workers: stacks, and Redis time per script.
    def drain() -> int:
        row.begin()
        try:
            row.enqueue(n, bulk=True)
            ws = row.start_workers(2)
            try:
                row.release(ws)
                recorder = Recorder(exe, out_dir, "drain", ws.all) if exe else None
                row.wait_drained(n, ws)
                if recorder is not None:
                    files = recorder.stop()
                    result["drain"] = {p.name: top_functions(p) for p in files if p.suffix == ".txt"}
                result["drain_rate_while_profiled"] = row.drain_times(n, ws).rate
            finally:
                row.stop_workers(ws)
        finally:
            row.cleanup()
        return n

    bench.log(f"profile: drain of {n:,} with py-spy on both workers and the dispatcher")
    result["redis_time_per_script_drain"] = slowlog_scripts(bench, drain)

    # Round trips on one idle worker: stacks, then calls per round trip.
    bench.log(f"profile: {rt_n} round trips with py-spy, then MONITOR on 5 more")
    row.begin()
    try:
        ws = row.start_workers(1)
        try:
            row.release(ws)
            assert row.client is not None
            row.client.run(CAPABILITY, payload(-1), timeout=60)
            recorder = Recorder(exe, out_dir, "rt", ws.all) if exe else None
            samples = row.round_trips(rt_n, ws)
            if recorder is not None:
                files = recorder.stop()
                result["round_trip"] = {p.name: top_functions(p) for p in files if p.suffix == ".txt"}
            result["rt_p50_ms_while_profiled"] = sorted(samples)[len(samples) // 2]
            result["monitor"] = monitor_round_trips(bench, row, ws, 5)
        finally:
            row.stop_workers(ws)
    finally:
        row.cleanup()
    write_summary(out_dir / "summary.md", result)
    return result


def write_summary(path: Path, result: dict[str, Any]) -> None:
    lines = ["# Reach profile", ""]
    for phase in ("drain", "round_trip"):
        for name, tops in (result.get(phase) or {}).items():
            lines += [f"## {phase}: {name} ({tops['samples']} samples, {tops['busy_pct']}% busy)", ""]
            for key, title in (("own_pct", "own time (share of busy samples)"),
                               ("inclusive_reach_pct", "inclusive, Reach code"),
                               ("inclusive_other_pct", "inclusive, libraries")):
                lines += [f"{title}:", ""]
                lines += [f"- {pct:5.1f}%  {fn}" for fn, pct in tops[key]]
                lines.append("")
    slow = result.get("redis_time_per_script_drain")
    if slow:
        lines += ["## Redis time per command/script during the drain", ""]
        lines += [f"- {k}: {v['calls']} calls, {v['usec_per_call']} µs/call, {v['usec_per_task']} µs/task"
                  for k, v in slow["by_command"].items()]
        lines.append("")
    mon = result.get("monitor")
    if mon:
        lines += ["## Redis calls per round trip (MONITOR)", ""]
        for owner, calls in mon["client_calls_per_task"].items():
            lines.append(f"- {owner}: " + ", ".join(f"{k} {v}" for k, v in calls.items()))
        lines.append("- inside scripts: " + ", ".join(
            f"{k} {v}" for k, v in mon["commands_inside_scripts_per_task"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
