"""The MCP server: every live capability of the fleet an MCP tool. Mounted by the gateway at /mcp
(streamable HTTP) and served alone by `reach mcp --transport stdio|http`. Needs the `mcp` extra:
pip install 'agent-reach[mcp]'.

    server    the tools, a call as a task, and telling clients when the tools change
    tools     capabilities as tools, a task's end as a tool result (pure)
    progress  a task's progress events as MCP progress notifications
    http      the /mcp route and what runs beside it
    serve     `reach mcp`: stdio, or HTTP on its own
"""
