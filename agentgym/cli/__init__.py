"""Every command, one module each: ``agentgym`` and its subcommands (``main`` parses and
dispatches; ``launch`` is ``agentgym train``'s launcher; ``bench``, ``chaos``, ``eval``, ``keys``,
``make_model``, ``slurm``, ``explain``, ``actors``, ``serve_env``) and the roles' own commands,
``agentgym-learner`` (``learner``), ``agentgym-actor`` (``actor``) and ``agentgym-relay``
(``relay``), with the config flags and host checks they share (``args``). A command parses its
flags, checks the config and calls its role's function. The top of the import graph: it may
import every package, and nothing imports it."""
