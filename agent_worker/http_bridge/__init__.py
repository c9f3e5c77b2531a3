"""The HTTP bridge: `reach-worker --http URL` serves capabilities with an HTTP agent written in
any language (the request/response contract is agent.py's docstring and the README's).

    agent      HttpAgent, the handler: the request, its headers, what the answer means
    outcome    an answer's outcome: business status first, then the HTTP status (pure)
    stream     answers that stream progress lines (NDJSON, SSE)
    accepted   answers of 202: the outcome by callback (through the gateway) or by polling
    bridge     what a worker's HTTP agents share: one pooled client, readiness, callbacks
    readiness  the readiness probe, and the agent not_ready while it fails
    options    the `--http-*` options (headers with ${ENV} expansion, never logged)

Import from the modules: a worker without HTTP agents (and the CLI reading `--http-*`) never
imports httpx.
"""
