"""What the learner computes from rewards: the algorithms' advantages and their losses, pure torch."""
