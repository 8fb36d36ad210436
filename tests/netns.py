"""The network-namespace hosts of the multi-host tests: ``agentgym.netns`` (it ships, because
``agentgym chaos`` uses it too). Tests import it from here or from there."""

from agentgym.netns import Cluster, Loopback, netns_unavailable

__all__ = ["Cluster", "Loopback", "netns_unavailable"]
