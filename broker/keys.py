"""Every Redis key and pub/sub channel name, built in one place.

All keys of one capability carry the hash tag `{<capability>}` so that every script touches
keys of one Cluster slot. The registry's keys share the tag `{_registry}` (a capability name
cannot start with '_', so the two never collide).

| key | type | written by | dies |
| --- | --- | --- | --- |
| P:{cap}:intake | stream, group `dispatch` | raw producers (any language) | entries deleted when taken |
| P:{cap}:queue | zset id -> enqueued_ms - priority * aging_ms | submit, promote | removed at dispatch |
| P:{cap}:delayed | zset id -> ready-at ms | retries | removed when due |
| P:{cap}:deadlines | zset id -> when to check its deadline | submit | when checked |
| P:{cap}:tasks | zset id -> created ms: the task index (12) | submit, dlq replay | pruned after result_ttl |
| P:{cap}:canceled | zset id -> canceled ms (12) | cancel | pruned after result_ttl |
| P:{cap}:task:{id} | hash: the record and its events (1) | every script | result_ttl after the end |
| P:{cap}:task:{id}:done | list: the outcome, for waiters (2) | terminal scripts | 1 min after the end |
| P:{cap}:task:{id}:callback | hash: callback tokens, outcomes (10) | HTTP bridge, gateway | its attempt |
| P:{cap}:inbox:{agent} | stream, group `agents` (3) | dispatch, submit; its agent reads | when finished |
| P:{cap}:grants | list of inbox slots submit may fill (4) | dispatchers | consumed; expires |
| P:{cap}:granted | hash agent id -> its grant; `#` (7) | dispatchers | replaced; expires |
| P:{cap}:pulls | hash agent id -> standing pull (6) | dispatchers | replaced; expires |
| P:{cap}:inboxes | set of agent ids that have an inbox | dispatch | never (a few bytes per agent) |
| P:{cap}:sessions | hash session_id -> agent id | dispatch | entries overwritten |
| P:{cap}:tokens | hash agent id -> sha1 of its token; `exp:<agent>` expiry | registration | unbind |
| P:{cap}:health | hash per agent: cf/lf, ok, cs/ls (failures, success, slow) | complete, reclaim | never |
| P:{cap}:stats | hash of counters (8) | scripts, dispatchers | never |
| P:{cap}:policy | hash: the capability's effective policy (9) | policy scripts, dispatchers | never |
| P:{cap}:policy:history | stream: every policy change (who, when, old -> new) | policy scripts | MAXLEN |
| P:{cap}:rate | hash: the rate limit's token bucket (tokens, at) | scripts that start tasks | idle |
| P:{cap}:explain:{id} | JSON: what one routing round saw | dispatchers | 15 minutes |
| P:{cap}:idem:{key} | string -> task id | submit | idempotency_ttl |
| P:{cap}:events | stream, capped: an entry per script call (5) | every script | MAXLEN ~ event_feed_maxlen |
| P:{cap}:dlq | stream of dead letters | dead-lettering | by `reach dlq purge` / retention |
| P:{_registry}:agents | zset agent id -> last heartbeat ms (server clock) | register, heartbeat | prune |
| P:{_registry}:agent:{agent} | hash, descriptor + token hash, expiry + stats | register, heartbeat | prune |
| P:{_registry}:join | hash: the join secret's salt, iterations, verifier | `reach agents secret` | clear |
| P:{_registry}:capabilities | set of capability names | clients, workers | never |
| P:{_registry}:changes, :rev | zset agent -> revision of last change; counter | registry scripts | prune |
| P:{_registry}:events | stream, capped: registry events | register, heartbeat, state changes | MAXLEN |
| P:{_registry}:served | set of capability names some agent registered for | register | never |
| P:{_registry}:policy, :policy:history | the fleet's policy (9), its changes | policy scripts | never |
| P:{_registry}:schedules, :fires | periodic schedules (JSON); last fire time | schedules | removed |
| P:{_registry}:apikeys | hash sha256 of an API key -> its record (JSON) | `reach keys` | revoked |
| P:{_rate:<who>} | hash: the gateway's token bucket of an API key or address (tokens, at) | gateways | idle |
| P:{_a2a}:tasks | zset task id -> created ms: tasks submitted over A2A (11) | gateway | trimmed |
| P:{_a2a}:context:{id} | zset task id -> created ms: one A2A context's tasks | gateway | result_ttl |
| P:{_registry}:console:secret | string: the key that signs console sessions | the first gateway | never |

(1) Events are fields of the record: `seq` counts them, `e:<n>` holds event n (see lua/_events.lua).
(2) Pushed only when someone registered to wait (record field `d`); its name is the record's key
    plus TASK_DONE_SUFFIX, which the scripts get as a constant of their prelude (scripts.py).
(3) Each entry carries the task's local id and fence, and what starting it needs (payload,
    attempt, timeout, ...) so the agent starts it as soon as it reads it.
(4) `agent|most unread|round|score|low`, in weighted random order: while the ready queue is
    empty, submit hands a task without routing constraints straight to the next grant's agent
    (`low`: a cold agent's grant, for low-priority tasks only).
(5) Its field `events` holds the call's events, one `task id|seq|event` line each.
(6) `most unread|round|score|low`: while tasks wait in the ready queue, the agent's completions
    take the next ones without routing constraints into its inbox, one per slot freed (see
    lua/complete.lua).
(7) The standing grant set by agent, and `#` the number of grants written: a completion that
    changes nothing a dispatcher acts on (successes only, the queue empty, the agent granted)
    gives the grants its tasks used back to the list, as credits, and wakes no dispatcher;
    submit reads `#` to tell when the grants fall below half (lua/complete.lua, lua/submit.lua).
(8) Counters, exact, each written once per script call that changes it (the field names are
    the STAT_* constants below; broker/protocol/counters.py reads them):
    `submitted`                tasks created by submit (a repeated submit counts once)
    `direct` `routed` `pulled` tasks put in an inbox by a submit's grant, a dispatcher's
                               round (dispatch.lua), an agent's completion (its standing pull);
                               dispatched = their sum
    `finished:<outcome>:<reason>`  tasks ended: succeeded and canceled with reason '', failed
                               with its reason (fail_task, the one place a task fails;
                               dead_letter_raw for an entry that is no task: `malformed`)
    `retries`                  retries scheduled after a retryable failure
    `reclaims`                 tasks taken back from an agent (a lapsed lease, unread in the
                               inbox of an agent offline or draining, an agent restarted)
    `reroutes`                 tasks routed past a full inbox (the dispatchers count them)
    `late_results`             reports of superseded attempts refused
    `removed`                  inbox entries deleted other than by a success's report, and the
                               lease sweep's corrections (active_sync.lua)
    The tasks in the capability's inboxes (dispatched or running; `max_running` is held against
    them) are direct + routed + pulled - finished:succeeded: - removed: no script writes a count
    of its own for them. Also `unserved_since` (dispatcher/no_agent.py).
(9) broker/policy.py: each field's effective value (the capability's own, else the fleet's,
    else the built-in default), `src:<field>` where it came from, `own:<field>` when it was set
    for this capability itself. The scripts read the capability's hash only (one slot); the
    dispatchers copy the fleet's values into it.
(10) An HTTP agent that answers 202 may post the attempt's outcome to the gateway later
    (lua/callback_arm.lua, lua/callback.lua): `t:<fence>` is the sha256 of that attempt's
    callback token, `o:<fence>` the outcome the gateway took.
(11) What A2A's ListTasks reads (gateway/a2a/index.py): the newest tasks, entries older than
    result_ttl trimmed; a task whose record expired is skipped when read.
(12) What `reach tasks` searches (broker/ops/search.py): every task by its submit time, written
    with one ZADD per submit call; the live states are found in the queue, delayed and inboxes,
    failed tasks in the DLQ, canceled ones in `canceled`. The dispatchers' housekeeping drops
    the entries older than result_ttl (their records are gone or going).
An agent's registry hash also holds `described`: the JSON of its capabilities' descriptions
(broker/models.py CapabilityDescription), written by register.lua; dispatchers never parse it.
"""

from __future__ import annotations

from dataclasses import dataclass

REGISTRY_TAG = "_registry"
A2A_TAG = "_a2a"
DISPATCH_GROUP = "dispatch"
"""The consumer group of every intake stream (the dispatchers read it)."""
AGENT_GROUP = "agents"
"""The consumer group of every inbox (its agent is the only consumer)."""
TASK_DONE_SUFFIX = ":done"
"""A task's done list is its record's key plus this (see CapabilityKeys.task_done)."""
TASK_DONE_MESSAGE = "done|"
"""A watched task's channel gets this plus its outcome (the done list's JSON) as it ends (see
lua/_finish.lua; read by broker/protocol/lifecycle.done_message)."""
DRAINING_FIELD = "draining:"
"""The tokens hash marks a draining agent with the field DRAINING_FIELD + agent id."""
TOKEN_EXPIRY_FIELD = "exp:"
"""The tokens hash keeps when an agent's token expires (ms, server clock) in the field
TOKEN_EXPIRY_FIELD + agent id (none: it never expires)."""
POLICY_PACKED_FIELD = "packed"
"""A policy hash's fields again, in one field the scripts read (see lua/_policy.lua)."""

STAT_SUBMITTED = "submitted"
STAT_DIRECT = "direct"
STAT_ROUTED = "routed"
STAT_PULLED = "pulled"
STAT_FINISHED = "finished:"
"""A finished counter's field is this plus `<outcome>:<reason>` (see finished_field)."""
STAT_RETRIES = "retries"
STAT_RECLAIMS = "reclaims"
STAT_REROUTES = "reroutes"
STAT_LATE_RESULTS = "late_results"
STAT_REMOVED = "removed"
"""The stats hash's counters (note (8) above)."""


def finished_field(outcome: str, reason: str = "") -> str:
    """The stats hash's counter of tasks that ended with `outcome` (and, failed, `reason`)."""
    return f"{STAT_FINISHED}{outcome}:{reason}"


LUA_CONSTANTS = {
    "AGENT_GROUP": AGENT_GROUP,
    "DISPATCH_GROUP": DISPATCH_GROUP,
    "DONE_SUFFIX": TASK_DONE_SUFFIX,
    "DONE_MESSAGE": TASK_DONE_MESSAGE,
    "DRAINING": DRAINING_FIELD,
    "TOKEN_EXP": TOKEN_EXPIRY_FIELD,
    "POLICY_PACKED_FIELD": POLICY_PACKED_FIELD,
    "STAT_SUBMITTED": STAT_SUBMITTED,
    "STAT_DIRECT": STAT_DIRECT,
    "STAT_ROUTED": STAT_ROUTED,
    "STAT_PULLED": STAT_PULLED,
    "STAT_SUCCEEDED": finished_field("succeeded"),
    "STAT_FAILED": finished_field("failed"),
    "STAT_CANCELED": finished_field("canceled"),
    "STAT_RETRIES": STAT_RETRIES,
    "STAT_RECLAIMS": STAT_RECLAIMS,
    "STAT_LATE_RESULTS": STAT_LATE_RESULTS,
    "STAT_REMOVED": STAT_REMOVED,
}
"""Names the scripts use that do not depend on the prefix: broker/script_source.py writes each
value in where a script names it, so that no `.lua` file spells one itself. (STAT_FAILED is the prefix of
a failed counter's field: a script appends the reason.)"""


@dataclass(frozen=True, slots=True)
class CapabilityKeys:
    prefix: str
    capability: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.capability}}}"

    @property
    def intake(self) -> str:
        return f"{self.base}:intake"

    @property
    def queue(self) -> str:
        return f"{self.base}:queue"

    @property
    def delayed(self) -> str:
        return f"{self.base}:delayed"

    @property
    def deadlines(self) -> str:
        return f"{self.base}:deadlines"

    @property
    def tasks(self) -> str:
        """The task index: local id -> submit time ms (see (12))."""
        return f"{self.base}:tasks"

    @property
    def canceled(self) -> str:
        return f"{self.base}:canceled"

    @property
    def inboxes(self) -> str:
        return f"{self.base}:inboxes"

    @property
    def sessions(self) -> str:
        return f"{self.base}:sessions"

    @property
    def health(self) -> str:
        return f"{self.base}:health"

    @property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @property
    def tokens(self) -> str:
        return f"{self.base}:tokens"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def dlq(self) -> str:
        return f"{self.base}:dlq"

    @property
    def grants(self) -> str:
        return f"{self.base}:grants"

    @property
    def granted(self) -> str:
        return f"{self.base}:granted"

    @property
    def pulls(self) -> str:
        return f"{self.base}:pulls"

    @property
    def policy(self) -> str:
        return f"{self.base}:policy"

    @property
    def policy_history(self) -> str:
        return f"{self.base}:policy:history"

    @property
    def rate(self) -> str:
        return f"{self.base}:rate"

    @property
    def inbox_prefix(self) -> str:
        """An inbox's key is this plus the agent id (for scripts that find the agent in data)."""
        return f"{self.base}:inbox:"

    def inbox(self, agent_id: str) -> str:
        return f"{self.inbox_prefix}{agent_id}"

    @property
    def task_prefix(self) -> str:
        """A task record's key is this plus its local id (for scripts that find it in data)."""
        return f"{self.base}:task:"

    def task(self, local_id: str) -> str:
        return f"{self.task_prefix}{local_id}"

    def task_done(self, local_id: str) -> str:
        return f"{self.task(local_id)}{TASK_DONE_SUFFIX}"

    def task_callback(self, local_id: str) -> str:
        return f"{self.task(local_id)}:callback"

    def explain(self, snapshot_id: str) -> str:
        return f"{self.base}:explain:{snapshot_id}"

    def idempotency(self, key: str) -> str:
        return f"{self.base}:idem:{key}"


@dataclass(frozen=True, slots=True)
class RegistryKeys:
    prefix: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{REGISTRY_TAG}}}"

    @property
    def agents(self) -> str:
        return f"{self.base}:agents"

    @property
    def capabilities(self) -> str:
        return f"{self.base}:capabilities"

    @property
    def changes(self) -> str:
        return f"{self.base}:changes"

    @property
    def rev(self) -> str:
        return f"{self.base}:rev"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def served(self) -> str:
        return f"{self.base}:served"

    @property
    def policy(self) -> str:
        return f"{self.base}:policy"

    @property
    def policy_history(self) -> str:
        return f"{self.base}:policy:history"

    @property
    def schedules(self) -> str:
        return f"{self.base}:schedules"

    @property
    def schedule_fires(self) -> str:
        return f"{self.base}:schedule_fires"

    @property
    def api_keys(self) -> str:
        return f"{self.base}:apikeys"

    @property
    def console_secret(self) -> str:
        """Signs the console's session cookies: shared by every gateway, so any of them
        accepts a session another one began."""
        return f"{self.base}:console:secret"

    @property
    def join_secret(self) -> str:
        """The fleet's join secret, as a verifier only (broker/identity.py)."""
        return f"{self.base}:join"

    def agent(self, agent_id: str) -> str:
        return f"{self.base}:agent:{agent_id}"

    def agent_client(self, agent_id: str) -> str:
        """The name (CLIENT SETNAME) of each Redis connection of the agent's worker process:
        a dispatcher that sees none left knows the process is gone (dispatcher/liveness.py)."""
        return f"{self.prefix}:agent:{agent_id}"

    def agent_of_client(self, client_name: str) -> str | None:
        """The agent a connection named by agent_client belongs to (None: not an agent's)."""
        head = f"{self.prefix}:agent:"
        if not client_name.startswith(head):
            return None
        return client_name[len(head):] or None

    def gateway_rate(self, identity: str) -> str:
        """The gateway's token bucket of one API key (`key:<id>`) or client address
        (`addr:<host>`): a hash tag of its own, so the buckets spread over a Cluster's slots."""
        return f"{self.prefix}:{{_rate:{identity.replace('{', '').replace('}', '')}}}"


@dataclass(frozen=True, slots=True)
class A2aKeys:
    """The gateway's index of the tasks A2A clients submitted (for ListTasks)."""

    prefix: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{A2A_TAG}}}"

    @property
    def tasks(self) -> str:
        return f"{self.base}:tasks"

    def context(self, context_id: str) -> str:
        return f"{self.base}:context:{context_id}"


@dataclass(frozen=True, slots=True)
class Channels:
    prefix: str

    @property
    def wake(self) -> str:
        """Wake-ups for the dispatchers (messages: broker/protocol/wake.py)."""
        return f"{self.prefix}:wake"

    @property
    def task_prefix(self) -> str:
        """A task's event channel is this plus its task id (published only while watched)."""
        return f"{self.prefix}:ev:"

    def task(self, task_id: str) -> str:
        return f"{self.task_prefix}{task_id}"

    @property
    def control_prefix(self) -> str:
        """An agent's control channel is this plus its agent id (`cancel <task id>`)."""
        return f"{self.prefix}:ctl:"

    def control(self, agent_id: str) -> str:
        return f"{self.control_prefix}{agent_id}"
