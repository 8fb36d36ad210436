"""``python -m agentgym.cli``: the ``agentgym`` command."""

from agentgym.cli.main import main

raise SystemExit(main())
