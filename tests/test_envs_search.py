"""``deepsearch``: the Factbook corpus and its questions, BM25 search, the episode contract, scoring,
the oracle expert on a sample of tasks, the on-disk index cache, and the env in the real EnvPool
(including a worker killed mid-episode)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.envpool.envs import factbook
from agentgym.envpool.envs.deepsearch import INVALID, DeepSearch, Index, parse_action
from agentgym.envpool.pool import EnvFailure, EnvPool


@pytest.fixture(scope="module")
def env() -> DeepSearch:
    return DeepSearch()


def find(kind: str, contains: str = "") -> int:
    return next(i for i, q in enumerate(factbook.questions()) if q.kind == kind and contains in q.text)


def test_corpus_and_questions_are_real_and_deterministic() -> None:
    ps = factbook.passages()
    assert len(ps) > 7000 and len({p.id for p in ps}) == len(ps)
    by_id = {p.id: p for p in ps}
    assert by_id["cd/Capital"].title == "Chad: Capital" and "N'Djamena" in by_id["cd/Capital"].text
    assert "Bogotá" in by_id["co/Capital"].text  # HTML entities decoded
    qs = factbook.questions()
    assert len(qs) > 2000
    kinds = {q.kind for q in qs}
    assert {"capital", "code", "highest", "prefix", "independence"} <= kinds
    assert {"capital->code", "code->capital", "capital->highest"} <= kinds
    for q in qs:  # every answer is in its last gold passage; every hop exists
        assert all(h in by_id for h in q.hops), q
        assert factbook.normalize(q.answer) in factbook.normalize(by_id[q.hops[-1]].text), q
    chad = qs[find("code->capital", ".td?")]
    assert (chad.answer, chad.hops) == ("N'Djamena", ("cd/Internet country code", "cd/Capital"))
    spans = factbook.split_ranges()
    assert spans["train"].start == 0 and spans["train"].stop == spans["dev"].start
    assert spans["dev"].stop == spans["test"].start and spans["test"].stop == len(qs)
    assert len(spans["test"]) > 150 and len(spans["dev"]) > 150
    for split, span in spans.items():
        assert all(factbook.split_of(qs[i].text) == split for i in span)
    assert DeepSearch.tasks("test") == spans["test"]
    with pytest.raises(ValueError, match="unknown split 'val'"):
        DeepSearch.tasks("val")


def test_scoring_is_squad_style() -> None:
    assert factbook.exact_match("the  Bogota!", "Bogotá") == 1.0
    assert factbook.exact_match(".td", "td") == 1.0
    assert factbook.f1("Mount Everest peak", "Mount Everest") == pytest.approx(0.8)
    assert factbook.f1("Paris", "Lyon") == 0.0 and factbook.f1("", "Lyon") == 0.0


def test_contract_search_answer_and_invalid_actions(env: DeepSearch) -> None:
    tid = find("capital", "of Chad?")
    assert env.reset(tid) == "Question: What is the capital of Chad?"
    assert "search[QUERY]" in env.instructions() and "answer[TEXT]" in env.instructions()
    r = env.step("I think I should look it up")
    assert (r.observation, r.reward, r.done, r.info["valid"]) == (INVALID, 0.0, False, False)
    r = env.step("search[]")
    assert r.observation.startswith("Empty query.") and not r.done
    r = env.step("search[zzzzqqq]")
    assert r.observation == "No passage matches 'zzzzqqq'." and r.info["results"] == 0
    assert env.step("search[the of !!]").info["results"] == 0  # stop words only
    assert env.step("search[Chad]").observation.startswith("[1] Chad: ")  # a one-word query
    r = env.step("Thought: find it.\nAction: search[Chad capital]")
    assert r.observation.startswith("[1] Chad: Capital\nname: N'Djamena") and r.reward == 0.0 and not r.done
    assert r.observation.count("\n[") == 2  # top_k=3 passages
    r = env.step("<answer>N'Djamena</answer>")
    assert (r.reward, r.done, r.info["success"], r.info["em"]) == (1.0, True, True, 1.0)
    after = env.step("answer[N'Djamena]")
    assert (after.reward, after.done) == (0.0, True)
    env.reset(tid)
    r = env.step("answer[Ndjamena city]")  # partial credit by F1
    assert r.done and r.info["success"] is False and r.reward == 0.0
    env.reset(tid)
    r = env.step("answer[the N'Djamena, Chad]")
    assert r.done and not r.info["success"] and 0 < r.reward < 1


def test_determinism_by_task_id() -> None:
    a, b = DeepSearch(), DeepSearch(top_k=3)
    for tid in (0, 77, 2000):
        actions = ["search[capital]", "search[highest point mountain]", "answer[x]"]
        ta = [a.reset(tid)] + [a.step(x).observation for x in actions]
        tb = [b.reset(tid)] + [b.step(x).observation for x in actions]
        assert ta == tb


def test_oracle_solves_a_sample_single_and_multi_hop(env: DeepSearch) -> None:
    qs = factbook.questions()
    sample = random.Random(0).sample(range(len(qs)), 150)
    hops = {1: 0, 2: 0}
    for tid in sample:
        env.reset(tid)
        searches = 0
        for _ in range(8):
            action = env.expert_action()
            r = env.step(action)
            searches += action.startswith("search[")
            if r.done:
                break
        assert r.done and r.info["success"] and r.reward == 1.0, (qs[tid], action)
        assert searches >= 1 and set(qs[tid].hops) <= env._shown  # it found every gold passage, no guess
        hops[len(qs[tid].hops)] += 1
    assert hops[1] > 20 and hops[2] > 20


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="option top_k must be an integer from 1 to 20, got 0"):
        DeepSearch(top_k=0)
    with pytest.raises(ValueError, match="option reward must be 'f1' or 'em', got 'bleu'"):
        DeepSearch(reward="bleu")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['topk'\]"):
        DeepSearch(topk=3)
    e = DeepSearch(reward="em", top_k=1, passage_chars=60)
    e.reset(find("capital", "of Chad?"))
    r = e.step("search[Chad Capital name N'Djamena geographic coordinates]")
    assert r.observation.startswith("[1] Chad: Capital\n") and r.observation.count("[") == 1
    assert r.observation.endswith("...") and len(r.observation.split("\n")[1]) == 60
    assert e.step("answer[the N'Djamena, Chad]").reward == 0.0
    with pytest.raises(ValueError, match="task id 99999 out of range"):
        e.reset(99999)
    assert parse_action("search[a] then answer[b]") == ("search", "a")
    assert parse_action("<search> x  y </search>") == ("search", "x y")
    assert parse_action("ANSWER[Lima]") == ("answer", "Lima")
    assert parse_action("search for it") is None


def test_index_cache_on_disk(tmp_path: Path) -> None:
    built = Index(str(tmp_path))
    (folder,) = tmp_path.iterdir()
    assert (folder / "params.index.json").exists()
    loaded = Index(str(tmp_path))
    for q in ("Chad capital", "highest point Nepal", "internet country code .fr", "Bogota"):
        assert [p.id for p in loaded.search(q, 5)] == [p.id for p in built.search(q, 5)]


def test_through_the_pool_and_a_killed_worker(tmp_path: Path) -> None:
    tid = find("capital->code", "Tunis")

    async def play(pool: EnvPool) -> tuple[float, int]:
        async with pool.episode(tid) as ep:
            assert (await ep.reset()).endswith("whose capital is Tunis?")
            for turn in range(1, 8):
                r = await ep.step(await ep.expert_action())
                if r.done:
                    return r.reward, turn
        raise AssertionError("not solved")

    async def main() -> None:
        async with EnvPool("deepsearch", {"cache_dir": str(tmp_path)}, 2) as pool:
            assert await asyncio.gather(play(pool), play(pool)) == [(1.0, 3), (1.0, 3)]
            async with pool.episode(tid) as ep:
                await ep.reset()
                os.kill(ep.worker_pid, signal.SIGKILL)
                with pytest.raises(EnvFailure) as err:
                    await ep.step("search[Tunis]")
                assert err.value.reason == "crash"
            assert await play(pool) == (1.0, 3)
            assert pool.stats()["failures"] == {"crash": 1}

    asyncio.run(main())


FORKED_BUILDERS = """
import os, sys
from agentgym.envpool.envs.deepsearch import Index
pids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            Index(sys.argv[1])
            code = 0
        finally:
            os._exit(code)
    pids.append(pid)
print([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids])
"""


def test_forked_builders_of_one_cache_do_not_collide(tmp_path: Path) -> None:
    # Env workers forked from one zygote build the index at once with the same object ids; each
    # must write its own temporary copy before the atomic rename (a name made from id() once
    # collided). Forked as the zygote forks: from a fresh single-threaded process.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", FORKED_BUILDERS, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == str([0] * 6), out.stdout + out.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == [f"factbook-bm25-{len(factbook.passages())}-t3-stem"]  # no leftovers
    assert Index(str(tmp_path)).search("capital of Chad", 3)
