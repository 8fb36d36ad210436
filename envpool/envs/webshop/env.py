"""``webshop``: buy the product an instruction describes, in a real browser on a local web shop.

    options:  num_products: int = 300     catalogue size (20..1000)
              seed: int = 0               catalogue seed
              page_size: int = 10         results per page
              viewport_width: int = 1024, viewport_height: int = 640
              chromium: str = "/usr/bin/chromium"   (a path, or a name looked up on PATH)
              action_timeout_s: float = 10    Playwright's deadline for one browser operation
              new_context_per_episode: bool = False   a fresh browser context (and renderer) per episode
    task:     goal = catalogue.goal(task_id), e.g. "buy a red cotton t-shirt in size M under $30"
    reset ->  "Task: ...\n\n" + the home page as text with element ids
    step  ->  the page after the action; done when an order is placed, reward = match fraction
              of the bought item (catalogue.py), success when it is 1.0

Each env instance (one per worker) owns a ``ShopServer`` on a free loopback port and one
headless Chromium with one page, reused across episodes; each episode gets a fresh shop session
(its own URL prefix, an empty cart), and "go back" never leaves it. Nothing an agent can see
depends on earlier episodes: the shop keeps its state in the session, not in cookies or storage.
A fresh browser context per episode (``new_context_per_episode``) isolates even the browser's
cache and history, at about twice the CPU per step (a new renderer process every episode;
docs/environments.md has the figures).

Playwright's sync API runs an event loop of its own in the calling thread: the env belongs in an
env worker process (as the pool runs it), not in a thread that runs asyncio.

Playwright rather than raw CDP: its actions wait for the navigations they start and for
elements to be actionable, it says clearly when the browser went away, and contexts isolate
episodes; with raw CDP all of that would be ours to write and keep right across Chromium
releases. The price is one Node driver process per worker (see bench/webshop_bench.py for its
memory). Playwright's own browser downloads are never used: ``executable_path`` points at
Debian's chromium, and Playwright gives every launch a fresh temporary user-data dir, which it
deletes when the browser closes. That dir is made under the env's own TMPDIR
(``TMP_PREFIX<pid>-…``), so the profile of a worker killed outright is found and removed too.

A browser that dies or hangs mid-episode makes ``step``/``reset`` raise ``BrowserFailure``: the
pool fails that one episode (``env_error``, the message naming the browser) and the next
``reset`` on this instance kills what is left of that browser and starts a new Chromium (and
driver) before playing. If the worker itself dies (killed by the pool after a timeout), the
driver sees its pipe close and takes Chromium and its profile directory along.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

import structlog

from agentgym.envpool.base import Env, InfoValue, StepResult
from agentgym.envpool.envs.webshop.browser import (
    CHROMIUM_FLAGS,
    LAUNCH_TIMEOUT_S,
    TMP_PREFIX,
    BrowserFailure,
    child_pids,
    find_chromium,
    kill_descendants,
    sweep_dead_tmpdirs,
)
from agentgym.envpool.envs.webshop.catalogue import SPLITS, Goal, catalogue
from agentgym.envpool.envs.webshop.expert import expert_move
from agentgym.envpool.envs.webshop.observe import (
    ACTIONS_HELP,
    OBSERVE_JS,
    Click,
    GoBack,
    Page,
    Scroll,
    Type,
    page_from_js,
    parse_action,
)
from agentgym.envpool.envs.webshop.server import ShopServer

log = structlog.get_logger(__name__)


def instructions(goal: Goal) -> str:
    return (
        f"You are shopping on Agentshop, a web shop. Task: {goal.instruction}.\n"
        "Each turn you see the visible part of the page; elements you can act on look like "
        '[12] button "Add to cart". Answer with one action:\n'
        f"  {ACTIONS_HELP.replace(' | ', chr(10) + '  ')}\n"
        "The episode ends when you place an order; the reward says how well the item matches the task."
    )


class WebShop(Env):
    name = "webshop"

    def __init__(
        self,
        num_products: int = 300,
        seed: int = 0,
        page_size: int = 10,
        viewport_width: int = 1024,
        viewport_height: int = 640,
        chromium: str = "/usr/bin/chromium",
        action_timeout_s: float = 10.0,
        new_context_per_episode: bool = False,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        self.catalogue = catalogue(num_products, seed)  # checks num_products and seed
        for key, value, lo, hi in (
            ("page_size", page_size, 1, 100),
            ("viewport_width", viewport_width, 320, 4096),
            ("viewport_height", viewport_height, 240, 4096),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"webshop: option {key} must be an integer in {lo}..{hi}, got {value!r}")
        if not isinstance(action_timeout_s, (int, float)) or not action_timeout_s > 0:
            raise ValueError(f"webshop: option action_timeout_s must be a number > 0, got {action_timeout_s!r}")
        if not isinstance(new_context_per_episode, bool):
            raise TypeError(
                f"webshop: option new_context_per_episode must be true or false, got {new_context_per_episode!r}"
            )
        self.new_context_per_episode = new_context_per_episode
        self.chromium = find_chromium(chromium)
        self.viewport = {"width": viewport_width, "height": viewport_height}
        self.timeout_ms = float(action_timeout_s) * 1000
        sweep_dead_tmpdirs()
        self._tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        self._server = ShopServer(self.catalogue, page_size)
        self._pw: Any = None
        self._driver_pids: set[int] = set()
        self._browser: Any = None
        self._broken = False
        self._context: Any = None
        self._page: Any = None
        self._goal: Goal | None = None
        self._token = ""
        self._shop_url = ""  # the session's home page; every page of the episode starts with it
        self._view: Page | None = None
        self._turns = 0
        self._done = False
        try:
            self._launch()
        except BaseException:
            self.close()
            raise

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> list[int]:
        """Task ids of ``split``: the goals of every product whose ``pid % 10`` falls in it
        (9 test, 8 dev, the rest train); ``options`` are the env's kwargs."""
        if split not in SPLITS:
            raise ValueError(f"env WebShop: unknown split {split!r}; splits are {list(SPLITS)}")
        n, seed = options.pop("num_products", 300), options.pop("seed", 0)
        unknown = set(options) - {
            "page_size",
            "viewport_width",
            "viewport_height",
            "chromium",
            "action_timeout_s",
            "new_context_per_episode",
        }
        if unknown:
            raise TypeError(f"env WebShop: unknown option(s) {sorted(unknown)}")
        return catalogue(n, seed).task_ids(split)

    # ------------------------------------------------------------ browser

    def _launch(self) -> None:
        try:
            from playwright.sync_api import Error, sync_playwright
        except ImportError as exc:
            raise ImportError(
                f"webshop: the playwright package is missing ({exc}); pip install 'playwright>=1.49' "
                "(its browser downloads are not needed: the env drives the system's Chromium)"
            ) from exc

        t0 = time.monotonic()
        before = child_pids()
        try:
            # The driver makes Chromium's temporary user-data dir under its TMPDIR: ours, so that
            # whatever a killed driver leaves behind is found and removed.
            saved = os.environ.get("TMPDIR")
            os.environ["TMPDIR"] = self._tmp
            try:
                self._pw = sync_playwright().start()
            finally:
                if saved is None:
                    os.environ.pop("TMPDIR", None)
                else:
                    os.environ["TMPDIR"] = saved
            self._driver_pids = child_pids() - before  # Playwright's Node driver
            # Playwright launches with a fresh temporary user-data dir and deletes it afterwards.
            self._browser = self._pw.chromium.launch(
                executable_path=self.chromium,
                args=list(CHROMIUM_FLAGS),
                headless=True,
                handle_sigint=False,  # the worker ignores Ctrl-C (the actor decides); so does the driver
                timeout=LAUNCH_TIMEOUT_S * 1000,
            )
        except Error as exc:
            self._stop_browser()
            raise BrowserFailure(f"webshop: cannot start Chromium ({self.chromium}): {exc.message}") from exc
        self._broken = False
        self.launch_seconds = time.monotonic() - t0
        log.debug("webshop_browser_started", chromium=self.chromium, seconds=round(self.launch_seconds, 2))

    def _stop_browser(self) -> None:
        """Close the context, the browser and the driver, whatever state they are in."""
        from playwright.sync_api import Error

        browser, pw = self._browser, self._pw
        self._context = self._page = self._browser = self._pw = None
        if browser is not None and not self._broken:
            try:
                browser.close()
            except Error:
                pass  # already gone; stopping the driver below ends what is left
        if self._broken:
            # A hung Chromium would hold the driver's graceful close for its own 30 s or more:
            # kill the browser's processes first, then the driver only has to notice.
            kill_descendants(self._driver_pids)
        if pw is not None:
            try:
                # Ends the Node driver, which kills any browser it launched that is still running.
                pw.stop()
            except Exception:  # noqa: BLE001 - a dead driver: nothing left to stop
                pass

    def _fail(self, what: str, exc: Exception) -> BrowserFailure:
        self._broken = True
        full = getattr(exc, "message", "") or str(exc)
        message = full.splitlines()[0][:300]
        task = self._goal.task_id if self._goal is not None else None
        log.warning("webshop_browser_failed", during=what, task=task, error=full[:4000])  # with Playwright's call log
        return BrowserFailure(f"webshop: browser failed during {what} (task {task}): {message}")

    def _observe(self) -> Page:
        from playwright.sync_api import Error

        try:
            result = self._page.evaluate(OBSERVE_JS)
        except Error as exc:
            if "context was destroyed" not in exc.message and "navigat" not in exc.message:
                raise
            # A navigation started by the action replaced the document under us: observe the new one.
            self._page.wait_for_load_state("load")
            result = self._page.evaluate(OBSERVE_JS)
        self._view = page_from_js(result)
        return self._view

    # ------------------------------------------------------------ episode

    def _end_episode(self, *, keep_page: bool = False) -> None:
        if self._token:
            self._server.drop_session(self._token)
            self._token = ""
        if keep_page and not self.new_context_per_episode:
            return
        context, self._context, self._page = self._context, None, None
        if context is not None and not self._broken:
            from playwright.sync_api import Error

            try:
                context.close()
            except Error:
                self._broken = True  # the browser went away between episodes: relaunch below

    def reset(self, task_id: int) -> str:
        from playwright.sync_api import Error

        goal = self.catalogue.goal(task_id)  # ValueError naming the id when it is out of range
        self._end_episode(keep_page=True)
        self._goal, self._turns, self._done, self._view = goal, 0, False, None
        if self._broken or self._browser is None or not self._browser.is_connected():
            self._stop_browser()
            self._launch()
        try:
            if self._page is None:
                self._context = self._browser.new_context(viewport=self.viewport)
                self._context.set_default_timeout(self.timeout_ms)
                self._page = self._context.new_page()
            else:
                self._context.clear_cookies()  # the shop sets none; an agent's page might
            url = self._server.open_session(goal)
            self._token = urlsplit(url).path.strip("/")
            self._shop_url = url
            self._page.goto(url)
            view = self._observe()
        except Error as exc:
            raise self._fail("reset", exc) from None
        return f"Task: {goal.instruction}\n\n{view.text}"

    def instructions(self) -> str:
        return instructions(self._goal) if self._goal is not None else ""

    def step(self, action: str) -> StepResult:
        from playwright.sync_api import Error

        if self._goal is None or self._view is None:
            return StepResult("no episode is running: reset first", 0.0, False, {"turns": self._turns})
        if self._done:
            return StepResult(
                "the episode is over: the order is placed", 0.0, True, {"turns": self._turns, "success": False}
            )
        self._turns += 1
        command = parse_action(action)
        if isinstance(command, (Click, Type)):
            el = self._view.elements.get(command.id)
            if el is None:
                command = f"there is no element [{command.id}] on the screen"
            elif isinstance(command, Type) and el.role != "textbox":
                command = f"element [{command.id}] is a {el.role}, not a textbox; type into a textbox"
        if isinstance(command, str):  # invalid: nothing happens in the browser
            text = f"invalid action: {command}\n\n{self._view.text}"
            return StepResult(text, 0.0, False, {"turns": self._turns, "valid": False})
        note = ""
        try:
            page = self._page
            if isinstance(command, Click):
                page.locator(f'[data-agid="{command.id}"]').click()
            elif isinstance(command, Type):
                box = page.locator(f'[data-agid="{command.id}"]')
                box.fill(command.text)
                if command.enter:
                    box.press("Enter")
            elif isinstance(command, Scroll):
                moved = page.evaluate(
                    "dy => { const y = window.scrollY; window.scrollBy({top: dy, behavior: 'instant'});"
                    " return window.scrollY !== y; }",
                    int(self.viewport["height"] * 0.75) * (1 if command.down else -1),
                )
                if not moved:
                    note = f"(already at the {'bottom' if command.down else 'top'} of the page)\n"
            elif isinstance(command, GoBack):
                # The first page of an episode was opened from about:blank: going back stops there.
                if page.go_back() is None or not page.url.startswith(self._shop_url):
                    if not page.url.startswith(self._shop_url):
                        page.go_forward()
                    note = "(there is no previous page)\n"
            page.wait_for_load_state("load")
            view = self._observe()
        except Error as exc:
            raise self._fail(f"step {self._turns} ({action[:60]!r})", exc) from None
        order = self._server.session(self._token).order
        if order is None:
            return StepResult(note + view.text, 0.0, False, {"turns": self._turns, "valid": True})
        self._done = True
        reward = self.catalogue.reward(self._goal, *order)
        info: dict[str, InfoValue] = {"turns": self._turns, "valid": True, "success": reward == 1.0, "bought": order[0]}
        return StepResult(view.text, reward, True, info)

    # ------------------------------------------------------------ expert

    def random_action(self, rng: random.Random) -> str:
        # Uniform over the elements on screen (a textbox gets 1-3 words of the task typed into it,
        # then Enter) and the three moves that need none; no look at the goal's attributes.
        view = self._view
        ids = sorted(view.elements) if view is not None else []
        pick = rng.randrange(len(ids) + 3)
        if pick >= len(ids):
            return ("scroll down", "scroll up", "go back")[pick - len(ids)]
        assert view is not None  # there are elements to pick from
        el = view.elements[ids[pick]]
        if el.role != "textbox":
            return f"click [{ids[pick]}]"
        words = re.findall(r"[a-z0-9]+", self._goal.instruction.lower()) if self._goal else ["shirt"]
        n = rng.randint(1, min(3, len(words)))
        j = rng.randrange(len(words) - n + 1)
        return f"type [{ids[pick]}] {' '.join(words[j : j + n])} [enter]"

    def expert_action(self) -> str:
        """Search with the instruction's words, open the goal product (scrolling the results; if it
        is not on the first page, its exact name as a second search), pick colour and size, add
        it, check out."""
        goal, view = self._goal, self._view
        if goal is None or view is None or self._done:
            return "scroll down"
        return expert_move(
            goal, view, self.catalogue.products[goal.pid].name, self._page.url, self._server.session(self._token).cart
        )

    def close(self) -> None:
        try:
            self._end_episode()
        finally:
            self._stop_browser()
            self._server.close()
            shutil.rmtree(self._tmp, ignore_errors=True)
            sweep_dead_tmpdirs()
