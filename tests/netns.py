"""The network-namespace hosts of the multi-host tests: ``agentgym.cluster.netns`` (it ships, because
``agentgym chaos`` uses it too). Tests import it from here or from there."""

from agentgym.cluster.netns import Cluster, Loopback, netns_unavailable

__all__ = ["Cluster", "Loopback", "netns_unavailable"]
