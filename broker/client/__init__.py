"""The producer clients: submit tasks by capability and wait for their outcome.

    ReachClient       synchronous, thread-safe (broker/client/sync.py)
    AsyncReachClient  asyncio; every wait of a client shares one pub/sub connection (aio.py)
"""

from broker.client.aio import AsyncReachClient, AsyncTaskHandle
from broker.client.sync import ReachClient, TaskHandle

__all__ = ["AsyncReachClient", "AsyncTaskHandle", "ReachClient", "TaskHandle"]
