"""The policy's support: which token ids an action may never contain.

    banned = banned_action_ids(tokenizer)   # sorted ids; () when nothing is banned

A chat model's tokenizer has special tokens (``<|im_start|>``, ``<|endoftext|>``, tool and vision
markers) that the chat template writes and no action should. A small or freshly trained policy
can still put its mass on one of them: one reward-free token that every group samples alike
gives no advantage to push it down, and the run settles there (measured: an async run on the
echo probe answered ``<|im_start|>`` to 88 of 102 tasks). So the policy is defined as the
model's softmax with these ids at probability 0, on both sides of the importance weight: the
engine never samples them (actors) and the learner evaluates the same masked distribution
(``learner/model/logprobs.py``), so π/μ stays exact. The end-of-sequence token stays allowed: it ends
the turn. ``rollout.allow_special_tokens = true`` turns this off (an env whose actions are
special tokens).

Both sides compute the set from the same tokenizer (the Welcome's model fingerprint makes it
the same), with this one function.
"""

from __future__ import annotations

import functools
from typing import Any


def banned_action_ids(tokenizer: Any) -> tuple[int, ...]:
    """Every special token id of ``tokenizer`` except its end-of-sequence token, sorted."""
    return _banned(tokenizer)


@functools.lru_cache(maxsize=16)
def _banned(tokenizer: Any) -> tuple[int, ...]:
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or () if i is not None}
    eos = getattr(tokenizer, "eos_token_id", None)
    allowed = {int(eos)} if eos is not None else set()
    return tuple(sorted(special - allowed))
