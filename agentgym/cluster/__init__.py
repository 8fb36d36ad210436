"""Running the roles across machines and testing them at scale: the weight relay one node runs
for its actors (``relay``, ``agentgym-relay``; ADR 0018), network namespaces for the chaos and
multi-host tests (``netns``), and simulated actor fleets for the scale benchmarks (``fleet``,
``play_fleet``). It sits above the learner and the actors: it may drive them; they never import
it."""
