"""One module per system of the fleet benchmark; SYSTEMS lists them in the table's order."""

from bench.fleet.systems.base import RunContext, System
from bench.fleet.systems.bullmq import BullMQSystem
from bench.fleet.systems.celery_system import CelerySystem
from bench.fleet.systems.dramatiq_system import DramatiqSystem
from bench.fleet.systems.reach import ReachSystem

SYSTEMS: list[type[System]] = [ReachSystem, BullMQSystem, CelerySystem, DramatiqSystem]

__all__ = ["SYSTEMS", "RunContext", "System"]
