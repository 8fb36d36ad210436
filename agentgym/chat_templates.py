"""Chat-template constants shared by the actors and the model makers.

    from agentgym.chat_templates import CHATML_TEMPLATE, IM_END

The actors fall back on ChatML for a tokenizer that has no chat template of its own; the model
makers (``agentgym/tiny_model.py``, ``agentgym/cmd_make_model.py``) write it into the tokenizers
they train. Living here, neither depends on the other.
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
