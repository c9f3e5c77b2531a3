"""Inspecting and replaying the dead-letter stream (library + `reach dlq` commands)."""
