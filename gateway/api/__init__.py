"""The gateway's API v1: one router per group of endpoints."""
