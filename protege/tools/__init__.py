"""Tools the policy calls during RL: a sandbox that runs model-written Python (protege.tools.sandbox)."""
from protege.tools.sandbox import Limits, Outcome, Sandbox, SandboxUnavailable, isolation_tool

__all__ = ["Limits", "Outcome", "Sandbox", "SandboxUnavailable", "isolation_tool"]
