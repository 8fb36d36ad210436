"""Built-in environments: ``guess_number`` (learnable by a tiny model) and ``chaos`` (pool tests)."""
