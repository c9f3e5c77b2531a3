"""Least-privilege Redis ACL users, one per role, and what a refusal by Redis means.

A role is what one kind of process does with Redis; `reach acl --role R` prints the rule:

    producer    submit, status, result, events, cancel (the Python client, `reach submit`)
    agent       a worker: register, heartbeat, read its inbox, report, renew, progress
    dispatcher  everything the dispatchers run (routing, leases, retries, housekeeping)
    operator    the operators' CLI: DLQ tools, policy, pause/resume, schedules, API keys,
                cancel in bulk (a dispatcher's commands too, for `reach up`-style stacks)
    reader      read-only: `reach agents|queues|status|tasks|dlq list/show/stats|policy show`
    gateway     `reach serve`: producer + reader + its own keys (API keys, console, A2A index)

Each rule allows only the keys and channels under one prefix (a tenant: tenant A's users
can neither read nor write tenant B's keys or channels, as long as neither prefix followed
by ':' starts the other), only the commands the role sends — including those its Lua
scripts call, as Redis checks a script's commands against the user who runs it — and never
FLUSH*, CONFIG, KEYS, DEBUG, SCRIPT FLUSH or SHUTDOWN. The reader's keys are read-only on
Redis 7 (`%R~`): it runs its read-only scripts with EVALSHA_RO, and even a command list
widened by mistake cannot write. Redis 6.2 has neither `%R~` nor EVALSHA_RO: there the
reader's rule grants EVALSHA and read commands only, so its scripts cannot write either
(every command inside a script is checked), but its key pattern allows writes a future
write command would get (docs/security.md).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from broker.errors import PermissionDenied
from broker.keys import A2aKeys, CapabilityKeys, RegistryKeys
from broker.script_source import READ_ONLY_SCRIPTS, SCRIPT_NAMES, source


class Role(StrEnum):
    PRODUCER = "producer"
    AGENT = "agent"
    DISPATCHER = "dispatcher"
    OPERATOR = "operator"
    READER = "reader"
    GATEWAY = "gateway"


_CONNECTION = frozenset({"ping", "select", "time", "subscribe", "unsubscribe", "script|load",
                         "script|exists"})
"""What every client sends besides its work: PING (health checks), SELECT (a /db in the URL),
TIME (the registry's clock), pub/sub, and loading a script Redis lacks (redis-py's Script)."""

_READS = frozenset({
    "exists", "get", "hexists", "hget", "hgetall", "hmget", "hlen", "llen", "lrange",
    "scard", "sismember", "smembers", "type", "pttl", "ttl", "xinfo|groups", "xinfo|stream",
    "xlen", "xpending", "xrange", "xrevrange", "zcard", "zcount", "zmscore", "zrange",
    "zrangebyscore", "zrevrange", "zrevrangebyscore", "zscore", "xread",
})
"""The plain reads of status pages, listings and the registry (no role needs more)."""

_SCRIPTS: dict[Role, frozenset[str]] = {
    Role.PRODUCER: frozenset({"submit", "watch", "cancel"}),
    Role.AGENT: frozenset({"register", "heartbeat", "deregister", "bind", "unbind", "accept",
                           "complete", "renew", "progress", "release", "callback_arm",
                           "agent_state"}),
    Role.DISPATCHER: frozenset(SCRIPT_NAMES),
    Role.OPERATOR: frozenset(SCRIPT_NAMES),
    Role.READER: READ_ONLY_SCRIPTS,
    Role.GATEWAY: frozenset({"submit", "watch", "cancel", "callback", "progress"}) | READ_ONLY_SCRIPTS,
}
"""The Lua scripts each role runs (its rule allows the commands inside them)."""

_DIRECT: dict[Role, frozenset[str]] = {
    Role.PRODUCER: _READS | {"blmove", "sadd"},
    # (An agent names its connections, which a dispatcher lists: dispatcher/liveness.py.)
    Role.AGENT: _READS | {"xreadgroup", "xack", "xautoclaim", "sadd", "hset", "blmove", "client|setname"},
    Role.DISPATCHER: _READS | {"xreadgroup", "xack", "xautoclaim", "xclaim", "xgroup|create",
                               "xadd", "xtrim", "xdel", "zrem", "zremrangebyscore",
                               "zremrangebyrank", "hset", "hsetnx", "hdel", "hincrby", "sadd",
                               "srem", "set", "del", "unlink", "pexpire", "publish", "client|list"},
    Role.OPERATOR: _READS | {"blmove", "sadd", "srem", "hset", "hsetnx", "hdel", "set", "del",
                             "unlink", "xadd", "xdel", "xtrim", "zadd", "zrem",
                             "zremrangebyscore", "publish", "xgroup|create"},
    Role.READER: _READS,
    Role.GATEWAY: _READS | {"blmove", "sadd", "hset", "hsetnx", "hdel", "set", "zadd",
                            "zremrangebyrank", "zremrangebyscore", "publish"},
}
"""The commands each role sends itself, besides _CONNECTION and its scripts'."""

_CAPABILITY_KINDS = ("intake", "queue", "delayed", "deadlines", "tasks", "canceled", "inboxes",
                     "sessions", "health", "stats", "tokens", "events", "dlq", "grants", "granted",
                     "pulls", "policy", "policy_history", "rate")
_REGISTRY_KINDS = ("agents", "capabilities", "changes", "rev", "events", "served", "policy",
                   "policy_history", "schedules", "schedule_fires", "api_keys", "console_secret",
                   "join_secret")
_ANY_CAPABILITY = "[a-z0-9]*"
"""A capability's hash tag in a key pattern: a capability name starts with [a-z0-9], so the
registry's `{_registry}` and the gateway's `{_a2a}` never match it."""


def key_patterns(prefix: str) -> dict[str, str]:
    """Each kind of key (named `cap.<kind>`, `registry.<kind>`, `a2a.<kind>`) as an ACL glob."""
    ck, rk, ak = CapabilityKeys(prefix, _ANY_CAPABILITY), RegistryKeys(prefix), A2aKeys(prefix)
    kinds = {f"cap.{kind}": str(getattr(ck, kind)) for kind in _CAPABILITY_KINDS}
    kinds |= {"cap.inbox": ck.inbox("*"), "cap.task": ck.task("*"), "cap.explain": ck.explain("*"),
              "cap.idempotency": ck.idempotency("*")}
    kinds |= {f"registry.{kind}": str(getattr(rk, kind)) for kind in _REGISTRY_KINDS}
    kinds |= {"registry.agent": rk.agent("*"), "a2a.tasks": ak.tasks, "a2a.context": ak.context("*")}
    return kinds


_PRODUCER_KEYS = {
    # (Every key a script is given must be writable: EVALSHA counts its keys as written.)
    "rw": ("cap.intake", "cap.queue", "cap.delayed", "cap.deadlines", "cap.tasks", "cap.canceled",
           "cap.stats", "cap.events", "cap.grants", "cap.granted", "cap.rate", "cap.task",
           "cap.idempotency", "cap.inbox", "cap.tokens", "cap.policy", "registry.capabilities"),
    "r": ("cap.inboxes", "registry.served", "registry.policy", "registry.agents", "registry.agent"),
}
_AGENT_KEYS = {
    "rw": (*(f"cap.{kind}" for kind in _CAPABILITY_KINDS if kind != "policy_history"),
           "cap.inbox", "cap.task", "registry.agents", "registry.agent", "registry.events",
           "registry.capabilities", "registry.changes", "registry.rev", "registry.served"),
    "r": ("registry.policy", "registry.join_secret"),
}
_GATEWAY_KEYS = {
    "rw": (*_PRODUCER_KEYS["rw"], "registry.console_secret", "a2a.tasks", "a2a.context"),
    "r": ("*",),
}
_KEYS: dict[Role, dict[str, tuple[str, ...]]] = {
    Role.PRODUCER: _PRODUCER_KEYS, Role.AGENT: _AGENT_KEYS, Role.GATEWAY: _GATEWAY_KEYS,
    Role.DISPATCHER: {"rw": ("*",), "r": ()}, Role.OPERATOR: {"rw": ("*",), "r": ()},
    Role.READER: {"rw": (), "r": ("*",)},
}
"""Which kinds of key each role may write (rw) and only read (r); `*` is every key of the
prefix. The producer never touches the DLQ, the schedules, the API keys or the fleet's policy
history; an agent neither; only the gateway the console's secret and the A2A index."""


def key_rules(role: Role, prefix: str, redis_version: int = 7) -> list[str]:
    """The key words of the role's rule: `~pattern` (read and write), `%R~pattern` (read only,
    Redis 7; on 6.2 the nearest rule is `~pattern`, reads and writes)."""
    kinds = key_patterns(prefix)
    every = f"{prefix}:*"

    def pattern(kind: str) -> str:
        return every if kind == "*" else kinds[kind]

    written = [pattern(kind) for kind in _KEYS[role]["rw"]]
    read = [pattern(kind) for kind in _KEYS[role]["r"] if pattern(kind) not in written]
    if redis_version < 7:
        return [f"~{p}" for p in (*written, *read)]
    return [*(f"~{p}" for p in written), *(f"%R~{p}" for p in read)]


NEVER = frozenset({"flushall", "flushdb", "config", "keys", "debug", "script|flush", "shutdown"})
"""What no role may run, whatever it is given (checked in rule(): a role table that grew one
of these is a bug)."""

_CALL = re.compile(r"(?:redis\.p?call\(|call_in_chunks\()\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Z]+)')?"
                   r"|pcall\(redis\.call,\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Z]+)')?")
_WITH_SUBCOMMANDS = frozenset({"xgroup", "xinfo", "script", "client", "object"})


@cache
def script_commands(name: str) -> frozenset[str]:
    """The commands script `name` calls, as ACL names (`xgroup|create`), read from its text."""
    found = set()
    for match in _CALL.finditer(source(name)):
        command = (match.group(1) or match.group(3)).lower()
        sub = match.group(2) or match.group(4)
        found.add(f"{command}|{sub.lower()}" if sub and command in _WITH_SUBCOMMANDS else command)
    return frozenset(found)


def _evals(role: Role, redis_version: int) -> frozenset[str]:
    if role is Role.READER:
        # (%R~ keys refuse EVALSHA, whose keys count as written; EVALSHA_RO refuses a write.)
        return frozenset({"evalsha_ro"}) if redis_version >= 7 else frozenset({"evalsha"})
    ro = {"evalsha_ro"} if redis_version >= 7 and _SCRIPTS[role] & READ_ONLY_SCRIPTS else set()
    # EVAL: the registry's clock on Cluster (broker/registry.py clock_of).
    return frozenset({"evalsha", "eval", *ro})


@cache
def role_commands(role: Role, redis_version: int = 7) -> frozenset[str]:
    """Every command `role` may run (ACL names), on Redis `redis_version` (6 or 7)."""
    scripted: set[str] = set()
    for name in _SCRIPTS[role]:
        scripted |= script_commands(name)
    commands = _CONNECTION | _DIRECT[role] | scripted | _evals(role, redis_version)
    if role is Role.READER and commands - _READS - _CONNECTION - _evals(role, redis_version):
        raise AssertionError(f"the reader would write: {sorted(commands - _READS - _CONNECTION)}")
    if commands & NEVER:
        raise AssertionError(f"role {role} would get {sorted(commands & NEVER)}")
    return frozenset(commands)


@dataclass(frozen=True, slots=True)
class AclRule:
    user: str
    role: Role
    prefix: str
    redis_version: int
    rules: str
    """The rule words after the user name (no password)."""

    def setuser(self, password_hash: str) -> str:
        """The ACL SETUSER command (`reset` first: the user gets exactly this, nothing kept)."""
        return f"ACL SETUSER {self.user} reset on #{password_hash} {self.rules}"

    def aclfile_line(self, password_hash: str) -> str:
        return f"user {self.user} on #{password_hash} {self.rules}"


def rule(role: Role, prefix: str, user: str | None = None, redis_version: int = 7) -> AclRule:
    """The ACL rule `role` needs for the keys and channels under `prefix`."""
    if redis_version not in (6, 7):
        raise ValueError("redis_version must be 6 (6.2) or 7 (7.0 and later)")
    keys = " ".join(key_rules(role, prefix, redis_version))
    commands = " ".join(f"+{c}" for c in sorted(role_commands(role, redis_version)))
    # resetchannels: Redis 6.2 grants every channel by default (7 none); the channels are the
    # prefix's own (wake-ups, task events, agent control).
    words = f"resetkeys {keys} resetchannels &{prefix}:* -@all {commands}"
    return AclRule(user or f"{prefix}-{role}", role, prefix, redis_version, words)


def password_hash(password: str) -> str:
    """How an aclfile and ACL SETUSER take a password without holding it: `#<sha256 hex>`."""
    return hashlib.sha256(password.encode()).hexdigest()


# What Redis says when a user lacks a permission: 7.x `NOPERM this user has no permissions to
# run the 'xdel' command` (also from inside a script), 6.2 in a script "The user executing the
# script can't run this command or subcommand".
_NOPERM = re.compile(r"NOPERM|no permissions? to|can't run this command|"
                     r"has no permissions to access", re.I)
_COMMAND = re.compile(r"run the '([^']+)' command")


def is_permission_error(exc: BaseException) -> bool:
    return bool(_NOPERM.search(str(exc)))


def roles_allowing(command: str) -> list[Role]:
    return [role for role in Role if command in role_commands(role)]


def denied(exc: BaseException, role: Role | str | None = None) -> PermissionDenied:
    """The Reach error for a refusal by Redis's ACL: what was refused, and which role's rule
    allows it (`reach acl --role R`)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else "permission denied"
    match = _COMMAND.search(text)
    hint = ""
    if match:
        command = match.group(1).lower()
        allowing = ", ".join(roles_allowing(command)) or "none (Reach never sends it)"
        hint = f"; the command {command!r} is allowed to the roles: {allowing}"
    elif "key" in text.lower():
        hint = ("; the user may not touch one of the keys this needs (another tenant's prefix, a "
                "kind of key its role does not reach, or a key it may only read)")
    elif "channel" in text.lower():
        hint = "; the user may not use a channel of this prefix"
    who = f" (this process runs as role {role}: `reach acl --role {role}` prints its rule)" \
        if role else " (`reach acl --role ROLE` prints each role's rule)"
    return PermissionDenied(f"Redis refused a command for lack of permission: {first}{hint}{who}")
