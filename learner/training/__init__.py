"""The learner's torch step: batches, the trainer, data-parallel ranks, checkpoints and weight export."""
