"""The WebShop expert: the next move toward buying the goal product, read from the page on screen.

    action = expert_move(goal, view, product_name, page_url, cart)    # WebShop.expert_action

Search with the instruction's words, open the goal product (scrolling the results; if it is not
on the first page, its exact name as a second search), pick colour and size, add it, check out.
A cart holding anything else is emptied first.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from agentgym.envpool.envs.webshop.catalogue import Goal
from agentgym.envpool.envs.webshop.observe import Page


def expert_move(goal: Goal, view: Page, product_name: str, url: str, cart: list[Any]) -> str:
    """The expert's action on ``view`` (the page at ``url``) for ``goal``, whose product is called
    ``product_name``; ``cart`` is the session's cart, (product id, colour, size) per item."""
    route = urlsplit(url).path.strip("/").partition("/")[2]
    want = (goal.pid, goal.colour, goal.size)

    def find(role: str, name: str | None = None, kind: str = "") -> int | None:
        for i, el in view.elements.items():
            if el.role == role and (name is None or el.name == name) and el.kind == kind:
                return i
        return None

    def click(role: str, name: str | None = None, kind: str = "") -> str:
        i = find(role, name, kind)
        if i is not None:
            return f"click [{i}]"
        return "scroll down" if view.below else "scroll up" if view.above else "go back"

    def cart_link() -> str:
        return click("link", f"Cart ({len(cart)})")

    if cart:
        if cart == [want]:
            if route == "checkout":
                return click("button", "Place order")
            return click("button", "Checkout") if route == "cart" else cart_link()
        return click("button", "Remove") if route == "cart" else cart_link()
    if route.startswith("product/"):
        if route != f"product/{goal.pid}":
            return "go back"
        colour = find("button", goal.colour, "colour")
        if colour is None or not view.elements[colour].selected:
            return click("button", goal.colour, "colour")
        size = find("button", goal.size, "size")
        if size is None or not view.elements[size].selected:
            return click("button", goal.size, "size")
        return click("button", "Add to cart")
    first_query = " ".join((goal.colour, *reversed(goal.attributes), goal.category))
    box = find("textbox")
    if route == "search":
        if find("link", product_name) is not None:
            return click("link", product_name)
        if view.below:
            return "scroll down"
        query = parse_qs(urlsplit(url).query).get("q", [""])[-1]
        if box is not None and query == first_query:
            return f"type [{box}] {product_name} [enter]"  # not among the results: ask for it by name
    if box is None:
        return "scroll up"
    return f"type [{box}] {first_query} [enter]"
