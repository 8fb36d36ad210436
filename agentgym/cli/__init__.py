"""The command line: ``agentgym`` and its subcommands, one module each (``main`` parses and
dispatches; ``launch`` is ``agentgym train``'s launcher; ``bench``, ``chaos``, ``eval``,
``keys``, ``make_model``, ``slurm``, ``explain``). The top of the import graph: it may import
every package, and nothing imports it. The roles' own entry points are ``agentgym-learner``
(``learner/main.py``), ``agentgym-actor`` (``actors/main.py``) and ``agentgym-relay``
(``agentgym/cluster/relay.py``)."""
