"""The key rules, in one place: key files and the client side of CURVE (``keys``: what actors,
the relay and ``agentgym keys`` use) and the serving side (``server``: the learner's and the
relay's key pair, allow-list and bind check; docs/adr/0009-authentication.md). Imported by the
learner, the actors and the relay; imports nothing of the project but itself."""
