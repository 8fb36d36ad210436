"""Playing episodes: the players, the rollout loop, conversations, critique, hand-over and agent programs."""
