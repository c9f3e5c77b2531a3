"""The A2A bridge: `reach-worker --a2a URL` makes an A2A agent (any agent speaking the Agent2Agent
protocol, v1.0) a Reach agent. Needs the `a2a` extra: pip install 'agent-reach[a2a]'.

    options   --a2a URL, --skill, --a2a-header
    cards     the agent's card: its skills as capabilities, with their descriptions
    messages  a task as a message, an answer as a result (pure)
    outcome   what the remote task's end means for the attempt (pure)
    agent     A2aAgent, the handler: send, stream or poll, cancel
    bridge    what a worker's A2A agents share: one pooled client, the cards, readiness
"""

try:
    import a2a  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    from broker.errors import ConfigError

    raise ConfigError("the A2A bridge needs the a2a extra: pip install 'agent-reach[a2a]'") from exc

from agent_worker.a2a.agent import A2aAgent
from agent_worker.a2a.bridge import A2aBridge
from agent_worker.a2a.options import A2aOptions

__all__ = ["A2aAgent", "A2aBridge", "A2aOptions"]
