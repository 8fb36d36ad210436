"""An agent written for the OpenAI API, with nothing of agentgym in it: it plays guess_number.

    function:  play(task, client) -> reward        actor.agent_endpoint.program = "examples/guess_number_agent.py:play"
    command:   python examples/guess_number_agent.py
               (OPENAI_BASE_URL, OPENAI_API_KEY, AGENTGYM_TASK from the environment; prints the reward)

A plain multi-turn loop: the model names a number, the agent answers "higher", "lower" or
"correct" (the secret is drawn from the task id as the guess_number env draws it), up to
``max_calls`` calls. Every text the agent writes is one the env writes too, so the tiny model's
tokenizer knows its words.
"""

from __future__ import annotations

import json
import os
import random
import re


def play(task: dict, client) -> float:
    opts = task.get("options", {})
    low, high = int(opts.get("low", 1)), int(opts.get("high", 8))
    secret = random.Random(task["task_id"]).randint(low, high)
    messages = [{"role": "user", "content": f"guess a number from {low} to {high}"}]
    for _ in range(task.get("max_calls", 6)):
        reply = client.chat.completions.create(
            model="policy", messages=messages, max_tokens=task.get("max_tokens_per_call", 1)
        )
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        m = re.search(r"[-+]?\d+", text)
        guess = int(m.group()) if m and len(m.group()) < 10 else None
        if guess is None or not low <= guess <= high:
            messages.append({"role": "user", "content": f"invalid, say a number from {low} to {high}"})
        elif guess == secret:
            return 1.0
        else:
            messages.append({"role": "user", "content": "higher" if guess < secret else "lower"})
    return 0.0


if __name__ == "__main__":
    import openai

    print(play(json.loads(os.environ["AGENTGYM_TASK"]), openai.OpenAI()))
