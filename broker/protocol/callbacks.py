"""Callbacks of HTTP agents: an attempt that an HTTP agent accepted (202) ends when the agent
posts its outcome to the gateway. callback_arm.lua records the attempt's token (its sha256)
under its fence before the request goes out; callback.lua takes the outcome for the current
attempt only. A token names its attempt's fence: `<fence>.<secret>`.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from broker.ids import split_task_id
from broker.keys import CapabilityKeys, Channels
from broker.protocol.calls import ScriptCall, Status
from broker.settings import Settings

CONTROL_VERB = "callback"
"""The verb of the control message that tells a worker a callback came (`callback <task id>`)."""


@dataclass(frozen=True, slots=True)
class CallbackToken:
    fence: str
    sha256: str


def new_token(fence: str) -> tuple[str, str]:
    """(a new callback token for the attempt with this fence, its sha256 hex)."""
    token = f"{fence}.{secrets.token_urlsafe(24)}"
    return token, token_sha256(token)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_token(token: str) -> CallbackToken | None:
    """The fence and hash of a token as an agent sent it back (None: not a callback token)."""
    fence, sep, secret = token.partition(".")
    if not (sep and fence.isascii() and fence.isdigit()) or len(fence) > 20 or not 16 <= len(secret) <= 128:
        return None
    return CallbackToken(fence, token_sha256(token))


def outcome_field(fence: str) -> str:
    """The callback hash's field that holds the outcome of the attempt with this fence."""
    return f"o:{fence}"


def callback_key(settings: Settings, task_id: str) -> str:
    capability, local = split_task_id(task_id)
    return CapabilityKeys(settings.prefix, capability).task_callback(local)


def arm_call(settings: Settings, task_id: str, fence: str, agent_id: str, sha256: str,
             ttl_ms: int) -> ScriptCall:
    capability, local = split_task_id(task_id)
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("callback_arm", [ck.task(local), ck.task_callback(local)],
                      [fence, agent_id, sha256, ttl_ms])


def callback_call(settings: Settings, task_id: str, token: CallbackToken, outcome: str) -> ScriptCall:
    capability, local = split_task_id(task_id)
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("callback", [ck.task(local), ck.task_callback(local)],
                      [token.fence, token.sha256, outcome, Channels(settings.prefix).control_prefix,
                       task_id])


def parse_status(reply: object) -> Status:
    """callback_arm.lua's and callback.lua's reply."""
    return Status(str(reply))
