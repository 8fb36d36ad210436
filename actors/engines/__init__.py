"""The actor's inference engines behind one interface (engine.py), built by name (builders.py)."""
