"""The live capabilities, as the agent protocols offer them (A2A skills, MCP tools), and the
check of a payload against a capability's input schema before anything is enqueued.

The catalog (broker/ops/catalog.py) is read at most once per FRESH_S by a gateway process,
however many cards, tool lists and calls ask for it. (Needs jsonschema, which the `a2a` and
`mcp` extras bring.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import jsonschema

from broker.ops.catalog import CapabilityRow, capability_rows
from gateway.state import GatewayState

log = logging.getLogger("reach.gateway")

FRESH_S = 1.0


class SchemaError(ValueError):
    """A payload that fails its capability's input schema; the message says where and why."""


class Capabilities:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self._rows: list[CapabilityRow] = []
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()
        self._validators: dict[str, tuple[str, Any]] = {}

    async def live(self, fresh: bool = False) -> list[CapabilityRow]:
        """The capabilities some live agent serves, with their descriptions."""
        async with self._lock:
            if fresh or time.monotonic() - self._read_at >= FRESH_S:
                gw = self.gw
                self._rows = await gw.in_thread(lambda r: capability_rows(r, gw.settings, live_only=True))
                self._read_at = time.monotonic()
            return self._rows

    async def find(self, name: str) -> CapabilityRow | None:
        for row in await self.live():
            if row.capability == name:
                return row
        for row in await self.live(fresh=True):  # (an agent may have come a moment ago)
            if row.capability == name:
                return row
        return None

    def check(self, row: CapabilityRow, payload: Any) -> None:
        """SchemaError when `payload` fails the capability's input schema."""
        schema = row.description.input_schema
        if not schema:
            return
        validator = self._validator(row.capability, schema)
        if validator is None:
            return
        error = jsonschema.exceptions.best_match(validator.iter_errors(payload))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the payload"
            raise SchemaError(f"{where}: {error.message}"[:500])

    def _validator(self, capability: str, schema: dict[str, Any]) -> Any:
        text = json.dumps(schema, sort_keys=True)
        known = self._validators.get(capability)
        if known is not None and known[0] == text:
            return known[1]
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
            validator = cls(schema)
        except jsonschema.exceptions.SchemaError as exc:
            log.warning("the input schema of %s is not a valid JSON Schema (%s); payloads are not "
                        "checked against it", capability, exc.message[:200])
            validator = None
        self._validators[capability] = (text, validator)
        return validator
