"""The dispatcher service: intake, priority queue with aging, agent selection, backpressure,
leases and reclaim, retries, deadlines, dead-lettering."""

from dispatcher.service import Dispatcher

__all__ = ["Dispatcher"]
