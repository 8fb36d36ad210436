"""The ``openenv`` adapter against the real ``openenv-core`` package: an OpenEnv ``Environment``
(examples/openenv_guess.py, nothing of agentgym in it) played through an ``EnvPool`` worker,
episode for episode what the env itself answers; an invalid reply; and the one-line errors."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentgym.envpool.pool import EnvPool
from agentgym.envpool.registry import EnvOptionsError, check_env

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
OPTIONS = {"env": "openenv_guess:GuessEnvironment", "high": 8, "python_path": [EXAMPLES]}


def test_an_openenv_environment_plays_in_a_pool_as_it_answers_itself() -> None:
    sys.path.insert(0, EXAMPLES)
    try:
        from openenv_guess import GuessAction, GuessEnvironment
    finally:
        sys.path.remove(EXAMPLES)

    async def main() -> None:
        async with EnvPool("openenv", OPTIONS, 1) as pool:
            for task in (3, 11):
                own = GuessEnvironment(high=8)  # the same env, called as OpenEnv's server calls it
                async with pool.episode(task) as ep:
                    first = await ep.reset()
                    assert first == own.reset(seed=task).message == "I am thinking of a number from 1 to 8. Guess it."
                    bad = await ep.step("banana")  # not an int: pydantic refuses it, the turn counts
                    assert (bad.reward, bad.done, bad.info["valid"]) == (0.0, False, False)
                    assert "Invalid action 'banana' for GuessAction (its 'guess')" in bad.observation
                    low, high = 1, 8
                    while True:  # binary search on the hints: a real game, to its end
                        guess = (low + high) // 2
                        r = await ep.step(str(guess))
                        mine = own.step(GuessAction(guess=guess))
                        assert (r.observation, r.reward, r.done) == (mine.message, mine.reward, mine.done)
                        if r.done:
                            break
                        low, high = (guess + 1, high) if r.observation.startswith("higher") else (low, guess - 1)
                    assert (r.reward, r.info["success"]) == (1.0, True) and r.observation == "Correct!"
                    assert r.info["turns"] == own.state.step_count + 1  # the invalid reply: a turn the env never saw

    asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"env": "openenv_guess:NoSuch"},
            r"option env: openenv_guess has no 'NoSuch'; its Environment classes: GuessEnvironment$",
        ),
        ({"env": "no_such_module:Env"}, r"option env: cannot import 'no_such_module'"),
        (
            {"action": "openenv_guess:Guess"},
            r"option action: openenv_guess has no 'Guess'; its Action classes: GuessAction$",
        ),
        ({"env": "openenv_guess:GuessAction"}, r"not an OpenEnv Environment subclass"),
        ({"action_field": "guesss"}, r"GuessAction has no field 'guesss'; its fields: \['guess', 'metadata'\]"),
        ({"high": 1}, r"openenv_guess:GuessEnvironment\(high\) failed: ValueError: high must be at least 2"),
        ({"seed": 3}, r"GuessEnvironment\(high, seed\) failed: TypeError: .*unexpected keyword argument 'seed'"),
    ],
)
def test_bad_options_fail_at_start_up_in_one_line(options: dict, match: str) -> None:
    with pytest.raises(EnvOptionsError, match=r"^env\.kwargs: env openenv: .*" + match) as err:
        check_env("openenv", {**OPTIONS, **options})
    assert "\n" not in str(err.value)


def test_without_the_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", None)  # what `import` sees where it is absent
    with pytest.raises(
        EnvOptionsError,
        match=r"env openenv needs the package of the 'openenv' extra: pip install 'agentgym\[openenv\]'",
    ):
        check_env("openenv", OPTIONS)
