"""Agent-Reach's shared core, and its public names.

    broker/             the core every process shares: settings, the key schema (keys.py), ids,
                        models, the agent registry's states, errors, and the Lua scripts
                        (lua/, run by scripts.py) with their typed contract (protocol/)
    broker/client/      the producer clients (ReachClient, AsyncReachClient)
    broker/ops/         what operators read: agents and queues as `reach agents|queues` show them
    broker/infra/       process plumbing: Redis connections, riding out outages, the event
                        loop, the embedded Redis
"""

from broker.client import AsyncReachClient, AsyncTaskHandle, ReachClient, TaskHandle
from broker.errors import (
    BadInput,
    BrokerUnavailable,
    ConfigError,
    InvalidCapability,
    InvalidPayload,
    InvalidPriority,
    InvalidTaskId,
    PermissionDenied,
    QueueFull,
    ReachError,
    TaskCanceled,
    TaskFailed,
    TokenRefused,
    UnknownTask,
)
from broker.models import AgentDescriptor, EventType, FailureReason, TaskEvent, TaskState, TaskStatus
from broker.protocol.submit import SubmitOptions
from broker.settings import Settings

__all__ = [
    "AgentDescriptor",
    "AsyncReachClient",
    "AsyncTaskHandle",
    "BadInput",
    "BrokerUnavailable",
    "ConfigError",
    "EventType",
    "FailureReason",
    "InvalidCapability",
    "InvalidPayload",
    "InvalidPriority",
    "InvalidTaskId",
    "PermissionDenied",
    "QueueFull",
    "ReachClient",
    "ReachError",
    "Settings",
    "SubmitOptions",
    "TaskCanceled",
    "TaskEvent",
    "TaskFailed",
    "TaskHandle",
    "TaskState",
    "TaskStatus",
    "TokenRefused",
    "UnknownTask",
]
