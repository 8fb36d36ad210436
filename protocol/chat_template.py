"""The chat template of the token stream: the constants the actors and the model makers share.

    from agentgym.protocol.chat_template import CHATML_TEMPLATE, IM_END

The actors fall back on ChatML for a tokenizer that has no chat template of its own; the model
makers (``agentgym/models/``, ``agentgym make-model``) write it into the tokenizers they train.
Living in ``protocol/`` (it says what the token ids of a rollout mean, as ``vocab.py`` does),
neither depends on the other.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2 of the tokenizers trained here

# ChatML, as Qwen2 writes it (without Qwen's default system prompt and tool blocks).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
