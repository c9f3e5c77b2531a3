"""Built-in agents, served by name with no handler given: `reach-worker --capability summarize`."""

BUILTIN_HANDLERS = {
    "summarize": "agent_worker.builtin.summarize:handle",
    "echo": "agent_worker.builtin.echo:handle",
}
