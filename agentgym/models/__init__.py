"""The demo's and the benchmarks' model makers: a tiny random Qwen2-style model with its own
tokenizer (``tiny``), the larger agent models (``agent``, their shapes in ``shapes``), and the
base model pretrained on random play (``base``). A training run needs none of them: the learner
and the actors take a model path; ``agentgym train`` and ``agentgym make-model`` call these when
the config asks (``model.create_tiny``). Imported only by the CLI, benches and tests."""
