"""A capability this worker serves and the handler that serves it (agent_worker/handlers.py
finds them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from broker.models import CapabilityDescription

Handler = Callable[..., Any]


@dataclass(frozen=True)
class Binding:
    """One capability this worker serves and how."""

    capability: str
    handler: Handler
    source: str
    is_async: bool
    payload_model: type[BaseModel] | None
    timeout_ms: int
    retry_failures: bool
    description: CapabilityDescription = field(default_factory=CapabilityDescription)

    def parse_payload(self, payload: Any) -> Any:
        if self.payload_model is None:
            return payload
        return self.payload_model.model_validate(payload)
