"""Moving dead letters between environments: export to JSON lines, import from them.

One line per dead letter, oldest first:

    {"v": 1, "capability": "summarize", "entry_id": "1712345678901-0", "fields": {...}}

`fields` are the stream entry's fields exactly (task_id, reason, error, attempts, last_agent_id,
dead_at, record, history, and raw/source for malformed entries). Import checks the whole file
before writing anything, adds each entry to its capability's DLQ (new stream id, every field
kept, plus `imported_from` naming the original entry), registers the capability, and skips
entries already present (same task id; for malformed entries the same dead_at and source), so
importing a file twice, or again after a crash, adds nothing twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker import codec
from broker.errors import BadInput, InvalidTaskId
from broker.ids import CAPABILITY_RE, split_task_id
from broker.keys import RegistryKeys
from dlq_tools.conn import Conn
from dlq_tools.models import Filter
from dlq_tools.scan import scan

FORMAT_VERSION = 1
REQUIRED_FIELDS = ("task_id", "reason", "dead_at")
_WRITE_CHUNK = 200


@dataclass(slots=True)
class ImportResult:
    read: int = 0
    imported: int = 0
    duplicates: int = 0
    by_capability: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def cli_dict(self) -> dict[str, Any]:
        return {"read": self.read, "imported": self.imported, "duplicates": self.duplicates,
                "by_capability": dict(sorted(self.by_capability.items())), "dry_run": self.dry_run}


def export(conn: Conn, capabilities: list[str], f: Filter, path: Path) -> int:
    """Write matching dead letters to `path` (via a temporary file, renamed at the end)."""
    tmp = path.with_name(path.name + ".partial")
    count = 0
    try:
        # (backslashreplace: the raw fields of a malformed entry may hold bytes that are not
        # UTF-8, read as lone surrogates; each is written as its JSON escape, and imported back)
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as out:
            for cap in capabilities:
                for entry_id, fields in scan(conn, cap, f, newest_first=False, mode="full"):
                    line = {"v": FORMAT_VERSION, "capability": cap, "entry_id": entry_id, "fields": fields}
                    out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
                    count += 1
        os.replace(tmp, path)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return count


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, parsed and checked line) for every non-blank line; BadInput on the first bad one."""
    try:
        handle = path.open("rb")  # (decoded line by line: a bad byte names its line)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BadInput(f"{path}:{number}: not UTF-8 text") from None
            if not text.strip():
                continue
            try:
                line = codec.loads(text)  # (strict; too deep a line is a ValueError, not a crash)
            except ValueError as exc:
                raise BadInput(f"{path}:{number}: not JSON ({exc})") from None
            problem = _check(line)
            if problem:
                raise BadInput(f"{path}:{number}: {problem}")
            yield number, line


def _check(line: Any) -> str | None:
    if not isinstance(line, dict):
        return "not a JSON object"
    if line.get("v") != FORMAT_VERSION:
        return f"unsupported format version {line.get('v')!r} (expected {FORMAT_VERSION})"
    cap = line.get("capability")
    if not isinstance(cap, str) or not CAPABILITY_RE.match(cap):
        return f"invalid capability {cap!r}"
    fields = line.get("fields")
    if not isinstance(fields, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in fields.items()
    ):
        return "fields must be an object of strings"
    if not all(_writable(k) and _writable(v) for k, v in fields.items()):
        return "fields hold a lone surrogate that stands for no byte (outside \\udc80-\\udcff)"
    missing = [name for name in REQUIRED_FIELDS if name not in fields]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    if not (fields["dead_at"].isascii() and fields["dead_at"].isdigit()):
        return f"dead_at must be milliseconds, got {fields['dead_at']!r}"
    if not _json_is(fields.get("record", "{}"), dict) or not _json_is(fields.get("history", "[]"), list):
        return "record must be a JSON object and history a JSON array"
    if fields["task_id"]:
        try:
            task_cap, _ = split_task_id(fields["task_id"])
        except InvalidTaskId:
            return f"invalid task id {fields['task_id']!r}"
        if task_cap != cap:
            return f"task {fields['task_id']} does not belong to capability {cap!r}"
    return None


def _json_is(text: str, kind: type) -> bool:
    try:
        return isinstance(codec.loads(text), kind)
    except ValueError:
        return False


def _writable(text: str) -> bool:
    """Whether `text` can be written to Redis: UTF-8, where lone surrogates \\udc80-\\udcff stand
    for the bytes that were not UTF-8 (as the connection reads them: surrogateescape)."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _identity(fields: dict[str, str]) -> str:
    """What makes two entries the same dead letter."""
    if fields.get("task_id"):
        return "task " + fields["task_id"]
    return f"raw {fields.get('dead_at', '')} {fields.get('source', '')}"


def import_file(conn: Conn, path: Path, *, dry_run: bool = False) -> ImportResult:
    result = ImportResult(dry_run=dry_run)
    present: dict[str, set[str]] = {}
    for _ in _lines(path):  # check everything before writing anything
        result.read += 1
    pending: list[tuple[str, dict[str, str]]] = []
    for _, line in _lines(path):
        cap, fields = line["capability"], dict(line["fields"])
        if cap not in present:
            present[cap] = {_identity(f) for _, f in scan(conn, cap, Filter(), newest_first=False,
                                                          mode="ids")}
        identity = _identity(fields)
        if identity in present[cap]:
            result.duplicates += 1
            continue
        present[cap].add(identity)
        fields["imported_from"] = f"{cap}/{line.get('entry_id', '')}"
        pending.append((cap, fields))
        result.imported += 1
        result.by_capability[cap] = result.by_capability.get(cap, 0) + 1
        if len(pending) >= _WRITE_CHUNK and not dry_run:
            _write(conn, pending)
            pending.clear()
    if pending and not dry_run:
        _write(conn, pending)
    return result


def _write(conn: Conn, rows: list[tuple[str, dict[str, str]]]) -> None:
    with conn.errors():
        pipe = conn.redis.pipeline(transaction=False)
        for cap in sorted({cap for cap, _ in rows}):
            pipe.sadd(RegistryKeys(conn.settings.prefix).capabilities, cap)
        for cap, fields in rows:
            pipe.xadd(conn.keys(cap).dlq, fields)
        pipe.execute()
