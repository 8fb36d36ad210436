"""agentgym: asynchronous actor-learner RL for LLM agents.

The training path is ``protocol`` (the wire), ``envpool`` (environments), ``actors`` and
``learner`` (the two roles), on the services ``config``, ``observe``, ``auth`` and ``host``.
Above them: ``cluster`` (relay, simulated fleets), ``models`` (the demo's model makers) and
``cli`` (the commands). docs/architecture.md draws the plan; import-linter checks it.
"""
