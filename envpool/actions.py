"""How an env with a fixed set of actions reads a reply: the whole reply, or the first action it names.

A model taught the env's format answers with the action alone ("move up"). A pretrained instruct
model answers in a sentence ("I will move up to reach the goal."). ``read_actions = "first"`` lets
such a model play: the earliest action phrase in the reply counts, as guess_number reads the first
integer. It is an env option, so a config chooses it and the held-out evaluation reads the same way.

    first_action("I will move up, then left.", {"move up": "up", "move left": "left"}) -> "up"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import TypeVar

T = TypeVar("T")

READS = ("exact", "first")
"""``exact``: the reply, trimmed and lower-cased, must be one action; ``first``: the earliest action
phrase in it counts."""


def check_read(env: str, read: object) -> str:
    """``read`` as an env's ``read_actions`` option, or a one-line error naming the env."""
    if read not in READS:
        raise ValueError(f"{env}: option read_actions must be one of {', '.join(map(repr, READS))}, got {read!r}")
    return str(read)


@cache
def _pattern(phrases: tuple[str, ...]) -> re.Pattern[str]:
    # Longest phrases first, so "turn left" wins over "left" where both start at one place; word
    # boundaries, so "drop" does not match inside "dropdown" and "up" not inside "upper".
    alternatives = sorted(phrases, key=len, reverse=True)
    spaced = (r"\s+".join(map(re.escape, p.split())) for p in alternatives)
    return re.compile(r"\b(" + "|".join(spaced) + r")\b", re.IGNORECASE)


def first_action(reply: str, actions: Mapping[str, T]) -> T | None:
    """The value of the earliest of ``actions``' phrases (lower-case) in ``reply``; None if none is."""
    match = _pattern(tuple(actions)).search(reply)
    return None if match is None else actions[" ".join(match.group(1).lower().split())]
