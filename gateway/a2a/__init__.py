"""The gateway's A2A server (Agent2Agent v1.0): every live capability a skill of the fleet's agent
card, and an agent card of its own; JSON-RPC and HTTP+JSON built on a2a-sdk's server pieces.
Needs the `a2a` extra: pip install 'agent-reach[a2a]'.

    routes     the endpoints, behind the gateway's API keys
    cards      the agent cards
    handler    A2A's operations, served from Reach (a2a-sdk's RequestHandler)
    requests   what a request asks beyond its message: skill, submit options, resume point
    snapshots  a Reach task as an A2A Task
    mapping    states, messages, events: Reach's in A2A's words (pure)
    index      the tasks A2A clients submitted, for ListTasks
"""
