"""``python -m agentgym.actors.main``: the ``agentgym-actor`` command (agentgym/cli/actor.py),
kept under this name for the launchers and scripts that spawn it."""

from agentgym.cli.actor import main

if __name__ == "__main__":
    raise SystemExit(main())
