"""``skyrl_gym``: any env registered in the ``skyrl-gym`` package (SkyRL's ``BaseTextEnv``:
``step(action) -> observations, reward, done, metadata``), played on the rows of a SkyRL-format
dataset. Needs the ``skyrl-gym`` extra.

    options:  env_id: str                  a registered id (``skyrl_gym.registry``: "gsm8k",
                                           "gsm8k_multi_turn", "aime", "lcb", "text2sql",
                                           "search", "searchcode"), or "module:Class"
              data: str                    the training rows: a JSON Lines file (or .parquet, with
                                           pyarrow installed), one task per row
              test_data: str = ""          the test rows (a separate file: disjoint as the files are)
              any other option             a key of the env's ``env_config`` (text2sql's
                                           ``db_path``, search's ``search_url``, ...)
    rows:     as SkyRL's datasets: ``prompt`` (a list of chat messages, or a string: one user
              message) and the env's extras (``reward_spec``, ``extra_info``, ``max_turns``,
              ...), handed to ``skyrl_gym.make(env_id, env_config=..., extras=row)`` as SkyRL's
              generator does. ``env_id`` picks the env; a row's ``env_class`` is ignored.
    task ids: train 0..rows-1 (ids below 2**30 wrap onto them), test from 2**30 + 10000 on.
    reset ->  a new env for the row; ``init(prompt)``'s user messages are the first observation,
              its system message the instructions.
    step  ->  the env's ``step(action)``: its observations' contents joined (tool output, a hint),
              its reward and done; scalar metadata goes into the step's info. Success: done with
              a reward of 1 or more.

An env that raises (a malformed row, a tool that fails) fails that one episode as an env error.
Envs that need a service (search's retriever, text2sql's databases, lcb's sandbox) need it
running or present, as they do in SkyRL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envpool.base import SPLITS, Env, StepResult
from agentgym.envpool.envs.ecosystem import TEST_START, one_line, require, split_index, unknown

NAME = "skyrl_gym"
EXTRA = "skyrl-gym"


def read_rows(path: str, key: str) -> list[dict[str, Any]]:
    """The rows of a JSON Lines or Parquet file; errors name the file, and the line."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"env {NAME}: option {key}: no file {path!r}")
    if p.suffix == ".parquet":
        pandas = require("pandas", EXTRA, NAME)
        return [dict(r) for r in pandas.read_parquet(p).to_dict("records")]
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"env {NAME}: {path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "prompt" not in row:
            raise ValueError(f"env {NAME}: {path}:{n}: a row must be an object with a 'prompt'")
        rows.append(row)
    if not rows:
        raise ValueError(f"env {NAME}: option {key}: {path} has no rows")
    return rows


def _count(path: object) -> int:
    return len(read_rows(str(path), "data")) if path else 0


def _text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages
    return "\n".join(str(m.get("content", "")) for m in messages or [] if isinstance(m, dict))


class SkyRLGym(Env):
    name = NAME
    preload = ("skyrl_gym", "omegaconf")  # imported once by the pool's zygote, shared by every forked worker

    def __init__(self, env_id: str = "", data: str = "", test_data: str = "", **env_config: Any) -> None:
        super().__init__()
        self._gym = require("skyrl_gym", EXTRA, NAME)
        if ":" not in env_id and env_id not in self._gym.registry:
            raise unknown(NAME, "env id", env_id, self._gym.registry)
        if not data:
            raise ValueError(f"env {NAME}: option data (a JSON Lines file of SkyRL rows) is required")
        self.env_id = env_id
        self.rows = {"train": read_rows(data, "data"), "test": read_rows(test_data, "test_data") if test_data else []}
        from omegaconf import OmegaConf

        self.env_config = OmegaConf.create(dict(env_config))  # SkyRL's envs read it as attributes
        self._env: Any = None
        self._done = True

    @classmethod
    def check_options(cls, **options: object) -> None:
        cls(**options)  # type: ignore[arg-type]  # the constructor checks them; reads the rows: a missing file or a bad line is named at start-up

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLITS:
            raise ValueError(f"env {NAME}: unknown split {split!r}; splits are {list(SPLITS)}")
        if split == "train":
            return range(0, _count(options.get("data")))
        if split == "test":
            return range(TEST_START, TEST_START + _count(options.get("test_data")))
        return range(0)

    def reset(self, task_id: int) -> str:
        split, index = split_index(NAME, task_id, len(self.rows["train"]), len(self.rows["test"]))
        row = self.rows[split][index]
        self._close_env()
        extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
        self._env = self._gym.make(self.env_id, env_config=self.env_config, extras=extras)
        prompt = row["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        first, _ = self._env.init(messages)
        self._instructions = _text([m for m in first if m.get("role") == "system"])
        self._done = False
        return _text([m for m in first if m.get("role") != "system"])

    def instructions(self) -> str:
        return self._instructions if self._env is not None else ""

    def step(self, action: str) -> StepResult:
        if self._done or self._env is None:
            return StepResult("the episode is over", 0.0, True, {"success": False})
        out = self._env.step(action)
        reward, done = float(out["reward"]), bool(out["done"])
        info: dict[str, str | int | float | bool] = {
            k: v if not isinstance(v, str) else one_line(v, 200)
            for k, v in (out.get("metadata") or {}).items()
            if isinstance(v, (str, int, float, bool))
        }
        if done:
            self._done = True
            info["success"] = reward >= 1.0
        return StepResult(_text(out.get("observations")), reward, done, info)

    def expert_action(self) -> str:
        raise NotImplementedError(f"env {NAME}: skyrl-gym envs have no scripted expert")

    def _close_env(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            env.close()

    def close(self) -> None:
        self._close_env()
