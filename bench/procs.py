"""Child processes: started in their own session, logged to files, always killed at the end.

Every process the harness starts goes through `Supervisor.spawn`. Each child leads its own
process group (so forked grandchildren, e.g. rq's work horses, die with it) and `kill_all`,
called from a `finally` and from atexit, SIGKILLs every group still alive: a failure or a
Ctrl-C never leaves workers behind.

Our own worker launchers (bench/workers/*.py, bench/bullmq/worker.js) speak a tiny line
protocol: they print `READY` once connected, start consuming on `GO`, print `STATS {json}` on
`REPORT`, and exit on `STOP`. Lines starting with an upper-case marker are kept for `wait_line`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: children run here, with it first on PYTHONPATH."""

_CLK_TCK = os.sysconf("SC_CLK_TCK")
MARKERS = ("READY", "STATS", "RESULT", "ERROR")


class ProcessFailed(RuntimeError):
    """A child exited early or did not answer in time; the message points to its log."""


class Proc:
    """One child process and its log."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path, piped: bool) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader: threading.Thread | None = None
        if piped:
            self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
            self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with open(self.log_path, "ab") as log:
            for raw in self.popen.stdout:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").strip()
                if line.startswith(MARKERS):
                    self.lines.put(line)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, line: str) -> None:
        """Write one command line to the child's stdin (ignored if it has gone)."""
        if self.popen.stdin is None or not self.alive():
            return
        with contextlib.suppress(BrokenPipeError, OSError):
            self.popen.stdin.write((line + "\n").encode())
            self.popen.stdin.flush()

    def wait_line(self, marker: str, timeout: float) -> str:
        """The text after `marker` on the next line that starts with it."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProcessFailed(f"{self.name} did not print {marker} within {timeout:.0f}s "
                                    f"(log: {self.log_path})")
            try:
                line = self.lines.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                if not self.alive():
                    raise ProcessFailed(f"{self.name} exited with {self.popen.returncode} "
                                        f"(log: {self.log_path}):\n{self.tail()}") from None
                continue
            if line.startswith("ERROR"):
                raise ProcessFailed(f"{self.name}: {line} (log: {self.log_path})")
            if line.startswith(marker):
                return line[len(marker):].strip()

    def tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        if not self.alive():
            raise ProcessFailed(f"{self.name} exited with {self.popen.returncode} "
                                f"(log: {self.log_path}):\n{self.tail()}")

    # -- measurements from /proc ------------------------------------------------------------

    def peak_rss_kb(self) -> int | None:
        """Peak resident set size (VmHWM) of this process, in KiB."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None

    def cpu_seconds(self) -> float | None:
        """User + system CPU of this process and of its children it has waited for."""
        return cpu_seconds(self.pid)

    def set_cpus(self, cpus: set[int] | None) -> None:
        set_affinity(self.pid, cpus)

    # -- stopping ---------------------------------------------------------------------------

    def ask_to_stop(self, command: str | None = None, sig: int = signal.SIGTERM) -> None:
        """A stdin command if given, else `sig`."""
        if not self.alive():
            return
        if command is not None:
            self.send(command)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def stop(self, timeout: float = 10.0, *, command: str | None = None,
             sig: int = signal.SIGTERM) -> None:
        """Ask politely, wait up to `timeout`, then SIGKILL the whole group."""
        stop_all([self], timeout, command=command, sig=sig)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self._reader is not None:
            self._reader.join(timeout=2)


class Supervisor:
    """Starts children and guarantees they are gone when the harness ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self._n = 0
        atexit.register(self.kill_all)

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str], *, piped: bool = False,
              cpus: set[int] | None = None, cwd: Path = ROOT) -> Proc:
        self._n += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{self._n:03d}-{name}.log"
        # Piped children are read (and logged) by a thread; the others write the log directly.
        log: IO[bytes] | int = subprocess.PIPE if piped else open(log_path, "wb")  # noqa: SIM115
        try:
            popen = subprocess.Popen(
                list(argv), env=env, cwd=cwd, start_new_session=True,
                stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )
        finally:
            if not isinstance(log, int):
                log.close()
        proc = Proc(name, popen, log_path, piped)
        self.procs.append(proc)
        if cpus is not None:
            proc.set_cpus(cpus)
        return proc

    def forget_dead(self) -> None:
        self.procs = [p for p in self.procs if p.alive()]

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.kill()
        self.procs.clear()


def stop_all(procs: Sequence[Proc], timeout: float = 10.0, *, command: str | None = None,
             sig: int = signal.SIGTERM) -> None:
    """Ask all at once, give them `timeout` together, then SIGKILL each group."""
    for proc in procs:
        proc.ask_to_stop(command, sig)
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(max(0.01, deadline - time.monotonic()))
    for proc in procs:
        proc.kill()


def cpu_seconds(pid: int) -> float | None:
    """utime + stime + cutime + cstime of `pid` from /proc, in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    # After the command name: state is fields[0]; utime, stime, cutime, cstime are 11..14.
    return sum(int(v) for v in fields[11:15]) / _CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all CPUs, /proc/stat), for noise accounting."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def set_affinity(pid: int, cpus: set[int] | None) -> None:
    """Pin `pid` (all its threads) to `cpus`; None means every CPU. Best effort."""
    target = cpus if cpus is not None else set(range(os.cpu_count() or 1))
    task_dir = Path(f"/proc/{pid}/task")
    tids = [int(t.name) for t in task_dir.iterdir()] if task_dir.is_dir() else [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, target)
