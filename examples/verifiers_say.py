"""A verifiers taskset (pip ``verifiers`` 0.4.0, ``verifiers.v1``) with nothing of agentgym in it:
each task asks for a number, and its rubric pays 1 when the reply says it.

    [env]
    name = "verifiers"
    kwargs = { "taskset.id" = "verifiers_say", "taskset.size" = 16, python_path = ["examples"] }

The same module runs under verifiers' own CLI (``vf eval verifiers_say`` with ``examples`` on
``PYTHONPATH``). Its words are the tiny demo model's ("say", digits), so the demo model reads them.
A taskset module exports its ``Taskset`` subclass in ``__all__``; verifiers finds it by module name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["SayTaskset"]


class SayData(vf.TaskData):
    answer: int = 0


class SayTask(vf.Task[SayData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def said(self, task: SayData, trace: vf.Trace) -> float:
        """1 when the first number of the last reply is the one asked for."""
        m = re.search(r"\d+", trace.last_reply or "")
        return 1.0 if m is not None and int(m.group()) == task.answer else 0.0


class SayConfig(vf.TasksetConfig):
    size: int = 16
    """Tasks: task i asks for i % 8 + 1."""


class SayTaskset(vf.Taskset[SayTask, SayConfig]):
    def load(self) -> Iterator[SayTask]:
        for i in range(self.config.size):
            n = i % 8 + 1
            yield SayTask(SayData(prompt=f"say {n}", answer=n), self.config.task)
