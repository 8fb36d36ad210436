"""What a run shows of itself: structured logs (``logs``), metrics sinks (``sinks``: JSONL,
TensorBoard, W&B), rates (``progress``), peak memory (``memstats``), and the run page that
``agentgym view`` writes (``viewer``). Imported by every role; imports no role."""
