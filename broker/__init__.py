"""Agent-Reach's shared core: settings, keys, scripts, models, errors and the producer clients."""

from broker.async_client import AsyncReachClient, AsyncTaskHandle
from broker.client import ReachClient, TaskHandle
from broker.errors import (
    BadInput,
    BrokerUnavailable,
    ConfigError,
    InvalidCapability,
    InvalidPayload,
    InvalidPriority,
    InvalidTaskId,
    QueueFull,
    ReachError,
    TaskCanceled,
    TaskFailed,
    TokenRefused,
    UnknownTask,
)
from broker.models import AgentDescriptor, EventType, FailureReason, TaskEvent, TaskState, TaskStatus
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
    "QueueFull",
    "ReachClient",
    "ReachError",
    "Settings",
    "TaskCanceled",
    "TaskEvent",
    "TaskFailed",
    "TaskHandle",
    "TaskState",
    "TaskStatus",
    "TokenRefused",
    "UnknownTask",
]
