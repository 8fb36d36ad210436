"""Write the tiny random model used by the quickstart and the tests.

    python scripts/make_tiny_model.py --out models/tiny --seed 0

Thin wrapper over ``agentgym.models.tiny.main`` (see that module for what is written).
"""

from __future__ import annotations

from agentgym.models.tiny import main

if __name__ == "__main__":
    raise SystemExit(main())
