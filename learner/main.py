"""``python -m agentgym.learner.main``: the ``agentgym-learner`` command (agentgym/cli/learner.py),
kept under this name for torchrun and the launchers that spawn it."""

from agentgym.cli.learner import main

if __name__ == "__main__":
    raise SystemExit(main())
