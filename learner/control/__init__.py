"""Who plays what and what a rollout is worth: the scheduler, the staleness rule, rollout checks."""
