"""The text of each Lua script of `broker/lua/`, as Redis is given it.

Each script is one atomic state change in its own file, opening with a comment that lists its
KEYS and ARGV. Files starting with '_' hold the helpers the scripts share. A script's text is
the helper definitions it uses (directly or through another helper), in LIBRARY order, then the
script itself, with the names of broker/keys.py's LUA_CONSTANTS replaced by their values.

Only the definitions used go in because Redis runs a script's whole text on every call, and
each `local function` there makes a new closure each time: prepending every helper cost a small
script most of its time (about 440 instructions per definition; submit.lua took 59 of them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from broker.keys import LUA_CONSTANTS

LUA_DIR = resources.files("broker") / "lua"

LIBRARY = ("_base", "_events", "_queue", "_finish", "_policy", "_delivery", "_wake", "_handoff",
           "_outcome", "_health", "_pull", "_credits")
"""The helper files, in the order they are prepended (each uses only those before it)."""

SCRIPT_NAMES = tuple(sorted(
    entry.name.removesuffix(".lua") for entry in LUA_DIR.iterdir()
    if entry.name.endswith(".lua") and not entry.name.startswith("_")
))
"""Every `<name>.lua` of the folder that is a script (not a helper file)."""

READ_ONLY_SCRIPTS = frozenset({"task_rows", "dlq_scan", "dlq_stats"})
"""The scripts that only read: broker/scripts.py runs them with EVALSHA_RO where Redis has it
(7.0 on), which a user with read-only keys may run (broker/acl.py's reader)."""

# A top-level definition starts at the first column: `local function f(` or `local a, b =`.
_DEFINITION = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*=)")
_COMMENT = re.compile(r"--.*$", re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One top-level statement of a helper file, with the comment lines above it."""

    text: str
    defines: frozenset[str]
    """Empty for a statement that defines nothing (it always goes in)."""
    uses: frozenset[str]


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(_COMMENT.sub("", text)))


def split_chunks(text: str) -> list[Chunk]:
    """A helper file cut at every line that starts a top-level statement (column 0, not a
    comment, not `end`); the comments above a statement go with it."""
    lines = text.splitlines(keepends=True)
    statements = [i for i, line in enumerate(lines)
                  if line[:1].strip() and not line.startswith(("--", "end"))]
    starts = []
    for i in statements:
        first = i
        while first > 0 and lines[first - 1].startswith("--"):
            first -= 1
        starts.append(first)
    chunks = []
    for at, begin, end in zip(statements, starts, [*starts[1:], len(lines)], strict=True):
        match = _DEFINITION.match(lines[at])
        names: set[str] = set()
        if match and match.group(1):
            names = {match.group(1)}
        elif match:
            names = {part.strip() for part in match.group(2).split(",")}
        body = "".join(lines[begin:end])
        chunks.append(Chunk(body, frozenset(names), _words(body)))
    return chunks


@cache
def _library() -> tuple[tuple[str, tuple[Chunk, ...]], ...]:
    return tuple((name, tuple(split_chunks((LUA_DIR / f"{name}.lua").read_text(encoding="utf-8"))))
                 for name in LIBRARY)


_CONSTANT = re.compile(r"\b(" + "|".join(map(re.escape, LUA_CONSTANTS)) + r")\b")
assert all(re.fullmatch(r"[\w:.|-]*", value) for value in LUA_CONSTANTS.values())  # (safe in quotes)


def with_constants(text: str) -> str:
    """The text with each constant of broker/keys.py written in as its string literal. (Not as
    locals at the head of the script: a helper that names a local of the script's top level
    takes it as an upvalue, which Lua finds by walking every open upvalue, on every call; a
    literal costs nothing.)"""
    return _CONSTANT.sub(lambda m: f"'{LUA_CONSTANTS[m.group(1)]}'", text)


def linked_helpers(body: str) -> str:
    """The helper definitions `body` uses, directly or through others, in library order."""
    wanted = set(_words(body))
    library = _library()
    keep: set[tuple[int, int]] = set()
    # A definition uses only those before it: walking backwards sees every user first.
    for f, (_, chunks) in reversed(list(enumerate(library))):
        for c in range(len(chunks) - 1, -1, -1):
            chunk = chunks[c]
            if not chunk.defines or chunk.defines & wanted:
                keep.add((f, c))
                wanted |= chunk.uses
    parts = []
    for f, (name, chunks) in enumerate(library):
        kept = [chunk.text for c, chunk in enumerate(chunks) if (f, c) in keep]
        if kept:
            parts.append(f"-- ===== {name}.lua =====\n" + "".join(kept))
    return "\n".join(parts)


@cache
def prelude() -> str:
    """The constants and every helper (for tests that call a helper directly)."""
    helpers = [f"-- ===== {name}.lua =====\n" + "".join(c.text for c in chunks)
               for name, chunks in _library()]
    return with_constants("\n".join(helpers))


@cache
def source(name: str) -> str:
    """The text Redis is given for script `name`."""
    body = (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")
    return with_constants("\n".join([linked_helpers(body), f"-- ===== {name}.lua =====", body]))
