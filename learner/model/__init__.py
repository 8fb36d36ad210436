"""The learner's models: the policy's forward pass, logprobs, the critic, prompt packing and LoRA."""
