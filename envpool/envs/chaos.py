"""``chaos``: a trivial env that misbehaves on request, for robustness tests of the pool.

    options:  crash_on_step    os._exit(3) at that step
              hang_on_step     sleep forever at that step
              raise_on_step    raise RuntimeError at that step
              garbage_on_step  write a corrupt frame to the pool's pipe at that step
              garbage          "oversize" (a length prefix above the limit) or "body" (not msgpack)
              only_task        misbehave only in episodes of this task id (None: in every episode)
              episode_len      steps until done (default 3; the last one gives reward 1)
              huge_on_step     the observation at that step is ``huge_chars`` characters long
              huge_chars       length of that observation (default 4,000,000: under the 8 MiB frame)

Steps are numbered from 1 within an episode; step 0 means "in reset". Every call prints a line
to stdout, which the worker must keep out of its frame stream. Otherwise the env echoes:
reset -> "chaos task 7", step("x") -> "echo x".
"""

from __future__ import annotations

import os
import sys
import time

from agentgym.envpool.base import Env, StepResult


class Chaos(Env):
    name = "chaos"
    replayable = False  # it crashes and hangs on request: a replay would misbehave again

    def __init__(
        self,
        crash_on_step: int | None = None,
        hang_on_step: int | None = None,
        raise_on_step: int | None = None,
        garbage_on_step: int | None = None,
        garbage: str = "oversize",
        only_task: int | None = None,
        episode_len: int = 3,
        huge_on_step: int | None = None,
        huge_chars: int = 4_000_000,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        if garbage not in ("oversize", "body"):
            raise ValueError(f"chaos: garbage must be 'oversize' or 'body', got {garbage!r}")
        if episode_len < 1:
            raise ValueError(f"chaos: episode_len must be >= 1, got {episode_len}")
        self.crash_on_step, self.hang_on_step = crash_on_step, hang_on_step
        self.raise_on_step, self.garbage_on_step = raise_on_step, garbage_on_step
        self.garbage, self.only_task, self.episode_len = garbage, only_task, episode_len
        self.huge_on_step, self.huge_chars = huge_on_step, huge_chars
        self._task = -1
        self._steps = 0

    def _misbehave(self, step: int) -> None:
        print(f"chaos stray print task={self._task} step={step}")  # must not corrupt the frames
        if self.only_task is not None and self._task != self.only_task:
            return
        if step == self.crash_on_step:
            sys.stdout.flush()
            os._exit(3)
        if step == self.hang_on_step:
            while True:
                time.sleep(3600)
        if step == self.raise_on_step:
            raise RuntimeError(f"chaos raise_on_step={step} task={self._task}")
        if step == self.garbage_on_step:
            from agentgym.envpool.worker import frame_fd

            fd = frame_fd()
            if fd is None:
                raise RuntimeError("chaos garbage_on_step: not running inside an env worker")
            # Either a prefix announcing 4 GiB, or a well-sized frame whose body is not msgpack.
            os.write(fd, b"\xff\xff\xff\xff" if self.garbage == "oversize" else b"\x02\x00\x00\x00\xc1\xc1")

    def reset(self, task_id: int) -> str:
        self._task, self._steps = task_id, 0
        self._misbehave(0)
        return self._maybe_huge(0, f"chaos task {task_id}")

    def step(self, action: str) -> StepResult:
        self._steps += 1
        self._misbehave(self._steps)
        done = self._steps >= self.episode_len
        info: dict[str, str | int | float | bool] = {"steps": self._steps}
        if done:
            info["success"] = True
        return StepResult(self._maybe_huge(self._steps, f"echo {action}"), 1.0 if done else 0.0, done, info)

    def _maybe_huge(self, step: int, text: str) -> str:
        if step != self.huge_on_step or (self.only_task is not None and self._task != self.only_task):
            return text
        return (text + " ") + "lorem ipsum 42 " * (self.huge_chars // 15)

    def expert_action(self) -> str:
        return "ok"

    def instructions(self) -> str:
        return "say anything"
