"""``webshop`` in real headless Chromium: the catalogue (splits, goals, reward, search), the shop's
HTTP server over real sockets, the action grammar, then the env itself (contract, invalid
actions, determinism, the expert) and the real EnvPool (a killed worker, a hung worker and a
killed browser each cost one episode and leave no Chromium behind; a missing Chromium is named).
Chromium is slow to start: one env in-process for the browser tests, one pool of one worker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import os
import re
import signal
import tempfile
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

import psutil
import pytest
from envpool_fixtures import expert_episode

from agentgym.envpool.envs.webshop.catalogue import VARIANTS, Catalogue, catalogue, words
from agentgym.envpool.envs.webshop.env import WebShop, find_chromium
from agentgym.envpool.envs.webshop.observe import MAX_TYPED, Click, GoBack, Scroll, Type, parse_action
from agentgym.envpool.envs.webshop.server import ShopServer
from agentgym.envpool.pool import EnvFailure, EnvPool, EnvStartError
from agentgym.envpool.registry import resolve_env

pytestmark = pytest.mark.timeout(300)

ELEMENT = re.compile(r'\[(\d+)\] (\w+) "([^"]*)"')


def element(observation: str, role: str, name: str) -> int:
    """The id the observation gives the element ``role "name"`` (what an agent reads)."""
    for i, r, n in ELEMENT.findall(observation):
        if (r, n) == (role, name):
            return int(i)
    raise AssertionError(f'no {role} "{name}" in:\n{observation}')


def click(env: WebShop, observation: str, role: str, name: str) -> str:
    """Scroll down until ``role "name"`` is on the screen, click it; the new observation."""
    for _ in range(10):
        if f'{role} "{name}"' in observation:
            return env.step(f"click [{element(observation, role, name)}]").observation
        observation = env.step("scroll down").observation
    raise AssertionError(f'no {role} "{name}" below:\n{observation}')


def play_expert(env: WebShop, task_id: int, max_turns: int = 20) -> tuple[str, list[tuple[str, Any]]]:
    first = env.reset(task_id)
    moves = []
    for _ in range(max_turns):
        action = env.expert_action()
        r = env.step(action)
        moves.append((action, (r.observation, r.reward, r.done, r.info)))
        if r.done:
            return first, moves
    raise AssertionError(f"task {task_id} not solved in {max_turns} turns: {moves}")


def run_async(main: Any) -> Any:
    """``asyncio.run(main())`` on a thread of its own: Playwright's sync API (the in-process env)
    keeps an event loop in the main thread, where ``asyncio.run`` refuses to start another."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, main()).result()


def chromium_pids_below(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def wait_gone(pids: list[int], seconds: float = 20) -> list[int]:
    """The processes of ``pids`` still running (zombies count as gone) after up to ``seconds``."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=seconds)
    running = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                running.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return running


# ---------------------------------------------------------------- catalogue, no browser


def test_catalogue_splits_goals_and_reward() -> None:
    train, dev, test = (WebShop.tasks(s) for s in ("train", "dev", "test"))
    assert len(train) + len(dev) + len(test) == 300 * VARIANTS
    assert not (set(train) & set(test)) and not (set(train) & set(dev)) and not (set(dev) & set(test))
    products = {split: {t // VARIANTS for t in ids} for split, ids in (("train", train), ("test", test))}
    assert not products["train"] & products["test"]  # no test goal names a training product
    assert resolve_env("webshop") is WebShop and WebShop.tasks("test", num_products=50, seed=3)[0] == 9 * VARIANTS
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        WebShop.tasks("valid")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['colour'\]"):
        WebShop.tasks("train", colour="red")

    # Everything is a function of (num_products, seed, task id), also in a fresh instance.
    a, b = catalogue(300, 0), Catalogue(300, 0)
    assert a.products == b.products and [a.goal(t) for t in range(0, 2400, 37)] == [
        b.goal(t) for t in range(0, 2400, 37)
    ]
    assert Catalogue(300, 1).products != a.products
    goal = a.goal(1234)
    p = a.products[goal.pid]
    assert goal.pid == 1234 // VARIANTS and goal.colour in goal.instruction and goal.size in goal.instruction
    assert all(attr in goal.instruction for attr in goal.attributes) and p.price_cents < goal.max_price_cents
    assert a.reward(goal, goal.pid, goal.colour, goal.size) == 1.0
    others = [c for c in p.colours if c != goal.colour]
    wrong = a.reward(goal, goal.pid, others[0], goal.size)
    assert wrong == pytest.approx(1 - 1 / (len(goal.attributes) + 3))
    other_category = next(q for q in a.products if q.category != p.category)
    assert a.reward(goal, other_category.pid, goal.colour, goal.size) == 0.0
    with pytest.raises(ValueError, match=r"task id 2400 is out of range 0..2399 \(num_products=300"):
        a.goal(2400)
    with pytest.raises(ValueError, match="num_products must be within 20..1000, got 5"):
        Catalogue(5)


def test_every_goal_is_found_by_the_experts_searches() -> None:
    # The expert searches for the goal's words and, if its product is not on the first page of
    # results, for the product's name: one of the two must show it on page one, for every task.
    for n in (300, 20):
        cat = catalogue(n)
        for t in range(cat.num_tasks):
            g = cat.goal(t)
            p = cat.products[g.pid]
            first = " ".join((g.colour, *reversed(g.attributes), g.category))
            assert p in cat.search(first)[:10] or p in cat.search(p.name)[:10], (n, t)
    assert words("Red T-Shirts, slim-fit!") == ["red", "t-shirt", "slim-fit"]


def test_action_grammar() -> None:
    assert parse_action("click [12]") == Click(12)
    assert parse_action("I see the shirt.\nAction: Click [3].") == Click(3)
    assert parse_action('type [2] "red socks" [enter]') == Type(2, "red socks", True)
    assert parse_action("type [2] red socks") == Type(2, "red socks", False)
    assert parse_action("scroll down") == Scroll(True) and parse_action("SCROLL up") == Scroll(False)
    assert parse_action("go back") == GoBack()
    assert parse_action("click [3]\ntype [2] x") == Type(2, "x", False)  # the last action line counts
    assert "no action found in 'buy it'" in parse_action("buy it")  # type: ignore[operator]  # an invalid action returns the message
    assert "cannot read 'click the red one'" in parse_action("click the red one")  # type: ignore[operator]  # an invalid action returns the message
    assert f"at most {MAX_TYPED}" in parse_action("type [2] " + "x" * 500)  # type: ignore[operator]  # an invalid action returns the message
    assert "actions are: click [ID]" in parse_action("")  # type: ignore[operator]  # an invalid action returns the message


def test_shop_server_over_http() -> None:
    cat = catalogue(300)
    server = ShopServer(cat, page_size=5)
    try:
        goal = cat.goal(1234)
        p = cat.products[goal.pid]
        home = server.open_session(goal)
        token = home.rstrip("/").rsplit("/", 1)[1]

        def get(path: str, data: dict[str, str] | None = None) -> str:
            body = urlencode(data).encode() if data is not None else None
            with urllib.request.urlopen(home + path, data=body, timeout=10) as resp:
                return resp.read().decode()

        assert "Welcome to Agentshop" in get("") and "Cart (0)" in get("")
        results = get("search?" + urlencode({"q": p.name}))
        assert p.name in results and "Page 1 of" in results
        page = get(f"product/{p.pid}")
        assert p.price in page and all(c in page for c in p.colours)
        # Adding without options comes back to the product page with an error; nothing is added.
        assert "Please choose a colour and a size." in get("cart/add", {"pid": str(p.pid)})
        assert server.session(token).cart == []
        cart = get("cart/add", {"pid": str(p.pid), "colour": goal.colour, "size": goal.size})
        assert "Cart (1)" in cart and "Checkout" in cart
        get("cart/add", {"pid": str(p.pid), "colour": goal.colour, "size": goal.size})
        assert "exactly one item; your cart has 2" in get("checkout")
        assert "Cart (1)" in get("cart/remove", {"index": "0"})
        assert "Order placed" in get("order", {}) and server.session(token).order == (p.pid, goal.colour, goal.size)
        assert "Order placed" in get("cart/remove", {"index": "0"})  # nothing changes after the order
        # Sessions are separate: a new one starts with an empty cart.
        assert "Cart (0)" in urllib.request.urlopen(server.open_session(goal), timeout=10).read().decode()
        for bad in ("product/99999", "nowhere"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                get(bad)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/nosuchsession/", timeout=10)
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(home, timeout=2)


def test_missing_chromium_and_bad_options_are_named() -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"chromium='/nonexistent/chromium' is not an executable Chromium.*apt-get install chromium",
    ):
        WebShop(chromium="/nonexistent/chromium")
    with pytest.raises(FileNotFoundError, match="chromium=''"):
        find_chromium("")
    with pytest.raises(ValueError, match="page_size must be an integer in 1..100, got 0"):
        WebShop(page_size=0)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['pages'\]"):
        WebShop(pages=3)

    async def main() -> None:
        pool = EnvPool("webshop", {"chromium": "no-such-chromium"}, 1)
        with pytest.raises(EnvStartError, match="FileNotFoundError: webshop: option chromium='no-such-chromium'"):
            await pool.start()

    run_async(main)


# ---------------------------------------------------------------- the env in Chromium


# A short viewport, so that results and product pages need scrolling (by the agent and the expert).
OPTIONS = {"viewport_height": 360}


@pytest.fixture(scope="module")
def env() -> Any:
    e = WebShop(**OPTIONS)
    yield e
    e.close()


def test_contract_and_invalid_actions(env: WebShop) -> None:
    first = env.reset(1234)
    goal = env.catalogue.goal(1234)
    assert first.startswith(f"Task: {goal.instruction}\n\nHome - Agentshop\n")
    assert goal.instruction in env.instructions() and "click [ID]" in env.instructions()
    home = first.split("\n\n", 1)[1]
    box = element(home, "textbox", "search")
    turns = 0
    for action, why in [
        ("I would like to buy something", "no action found"),
        ("click [99]", "there is no element [99] on the screen"),
        (f"type [{element(home, 'link', 'socks')}] socks", "is a link, not a textbox"),
        (f"type [{box}] " + "y" * 300, "at most 200"),
        ("scroll up", "(already at the top of the page)"),
        ("go back", "(there is no previous page)"),
    ]:
        r = env.step(action)
        turns += 1
        assert why in r.observation and (r.reward, r.done, r.info["turns"]) == (0.0, False, turns), (action, r)
        assert home in r.observation  # the page is shown again, unchanged
    r = env.step(f"Search first.\nAction: type [{box}] hoodie [enter]")
    assert r.observation.startswith("Results - Agentshop") and 'value="hoodie"' in r.observation
    assert "(more below: scroll down)" in r.observation
    down = env.step("scroll down").observation
    assert "(more above: scroll up)" in down and down != r.observation
    back = env.step("go back").observation
    # Home again, with what was typed into its search box: Chromium restores form state on "back".
    assert back.startswith("Home - Agentshop\n") and back == home.replace('"search"', '"search" value="hoodie"')
    # A wrong purchase ends the episode with partial credit; the shop then stays closed.
    obs = env.step(f"type [{box}] {env.catalogue.products[goal.pid].name} [enter]").observation
    obs = env.step(f"click [{element(obs, 'link', env.catalogue.products[goal.pid].name)}]").observation
    p = env.catalogue.products[goal.pid]
    wrong = next(c for c in p.colours if c != goal.colour)
    obs = click(env, obs, "button", wrong)
    assert f'button "{wrong}" (selected)' in obs
    obs = click(env, obs, "button", "Add to cart")
    assert "Please choose a size." in obs and "Cart (0)" in obs  # nothing added
    obs = click(env, obs, "button", goal.size)
    obs = click(env, obs, "button", "Add to cart")
    obs = click(env, obs, "button", "Checkout")
    r = env.step(f"click [{element(obs, 'button', 'Place order')}]")  # the checkout page fits the screen
    assert r.done and 0 < r.reward < 1 and r.info["success"] is False and r.info["bought"] == goal.pid
    assert f"colour {wrong}" in r.observation
    after = env.step("go back")
    assert (after.reward, after.done) == (0.0, True) and "the order is placed" in after.observation


def test_same_task_same_episode_and_expert_solves_a_sample(env: WebShop) -> None:
    tasks = [WebShop.tasks("test")[0], WebShop.tasks("test")[77], WebShop.tasks("train")[500]]
    played = {t: play_expert(env, t) for t in tasks}
    for t, (_first, moves) in played.items():
        observation, reward, done, info = moves[-1][1]
        assert (reward, done, info["success"]) == (1.0, True, True), (t, moves)
        assert "Order placed" in observation and len(moves) <= 12
    assert len({first for first, _ in played.values()}) == len(tasks)  # different tasks, different goals
    # The same task again (after other episodes on this browser) plays exactly the same.
    assert play_expert(env, tasks[0]) == played[tasks[0]]


# ---------------------------------------------------------------- through the real EnvPool


def test_pool_survives_a_killed_worker_a_hung_worker_and_a_killed_browser(env: WebShop) -> None:
    profiles_before = set(glob.glob("/tmp/playwright_chromiumdev_profile-*"))
    own_before = set(glob.glob(f"{tempfile.gettempdir()}/agentgym-webshop-*"))  # the in-process env's

    async def failing_episode(pool: EnvPool, task_id: int, break_it: Any) -> tuple[EnvFailure, int, list[int]]:
        async with pool.episode(task_id) as ep:
            await ep.reset()
            pid = ep.worker_pid
            assert pid is not None
            below = chromium_pids_below(pid)
            assert any("chrom" in psutil.Process(p).name() for p in below)
            action = await ep.expert_action()
            break_it(pid, below)
            with pytest.raises(EnvFailure) as err:
                await ep.step(action)
            return err.value, pid, below

    def browser_of(below: list[int]) -> int:
        return next(
            p
            for p in below
            if psutil.Process(p).name() == "chromium"
            and not any(a.startswith("--type=") for a in psutil.Process(p).cmdline())
        )

    task = WebShop.tasks("test")[3]
    in_process = play_expert(env, task)

    async def main() -> None:
        # A fresh context per episode in the pool, one page for all in-process: the same episodes.
        options = {**OPTIONS, "new_context_per_episode": True}
        async with EnvPool("webshop", options, 1, step_timeout_s=10, reset_timeout_s=90, start_timeout_s=90) as pool:
            # The expert through the pool plays exactly what it plays in-process (another process,
            # another browser, a fresh context).
            first, moves, reward = await expert_episode(pool, task, 20)
            assert reward == 1.0 and (first, moves) == (in_process[0], [(a, r[0]) for a, r in in_process[1]])

            # A worker killed mid-episode: one failed episode; its driver and Chromium go with it.
            err, pid, below = await failing_episode(pool, 11, lambda pid, _: os.kill(pid, signal.SIGKILL))
            assert err.reason == "crash" and f"env worker pid {pid} exited with code -9 during Step" in str(err)
            assert wait_gone(below) == []

            # A hung worker: the step times out, the pool kills it, and its browser goes too.
            err, pid, below = await failing_episode(pool, 12, lambda pid, _: os.kill(pid, signal.SIGSTOP))
            assert err.reason == "timeout" and "no reply to Step within 10 s" in str(err)
            assert wait_gone([pid, *below]) == []

            # A browser killed under a live worker: the env names it, the worker stays and relaunches.
            err, pid, below = await failing_episode(
                pool, 13, lambda _, below: os.kill(browser_of(below), signal.SIGKILL)
            )
            assert err.reason == "env_error" and "webshop: browser failed during" in str(err)
            _, _, reward = await expert_episode(pool, 14, 20)
            async with pool.episode(15) as ep:
                await ep.reset()
                assert ep.worker_pid == pid
            assert reward == 1.0 and wait_gone(below) == []
            stats = pool.stats()
            assert stats["failures"] == {"crash": 1, "timeout": 1, "env_error": 1} and stats["restarts"] == 2
            live = chromium_pids_below(pid)
        assert wait_gone([pid, *live]) == []  # close() ends the worker, its driver and Chromium
        assert set(glob.glob("/tmp/playwright_chromiumdev_profile-*")) <= profiles_before
        # Chromium's profiles lived in the envs' own temp dirs, the killed workers' included: all gone.
        assert set(glob.glob(f"{tempfile.gettempdir()}/agentgym-webshop-*")) <= own_before

    run_async(main)
