"""The shop's HTTP server: server-rendered HTML pages over a ``Catalogue``, one per env instance.

    server = ShopServer(catalogue(300), page_size=10)   # listens on a free 127.0.0.1 port
    url = server.open_session(goal)                      # http://127.0.0.1:PORT/s1/ (the home page)
    ...                                                  # the browser shops; the env reads:
    server.session("s1").order                           # (pid, colour, size) once an order is placed
    server.close()

Pages (every URL starts with the session, so an episode's cart is its own and nothing depends on
cookies): ``/`` home, ``/search?q=&page=`` results, ``/product/PID?colour=&size=`` a product with
its options as buttons, ``/cart``, ``/checkout``, ``/done``; POST ``/cart/add``,
``/cart/remove``, ``/order`` answer 303 to a page (post/redirect/get, so "go back" never meets a
resubmission prompt). An order holds exactly one item: the checkout page says so otherwise.

The standard library's ``ThreadingHTTPServer`` suffices: a dozen routes of small HTML, one browser
as the only client, no templates or async framework needed, and it starts in a millisecond
in a daemon thread of the env worker (the Playwright calls block the main thread meanwhile).
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from agentgym.envpool.envs.webshop.catalogue import CATEGORIES, Catalogue, Goal, Product, dollars

SHOP = "Agentshop"

_STYLE = """
body { font-family: sans-serif; margin: 0; font-size: 16px; line-height: 1.4; }
header { padding: 10px 16px; border-bottom: 1px solid #ccc; display: flex; gap: 16px; align-items: center; }
header form { display: flex; gap: 6px; }
main { padding: 8px 16px; max-width: 860px; }
ul.results li { margin: 10px 0; }
.options a { display: inline-block; border: 1px solid #888; padding: 4px 10px; margin: 2px; color: #000;
             text-decoration: none; }
.options a[aria-pressed=true] { background: #333; color: #fff; }
.error { color: #b00; }
"""


@dataclass
class Session:
    goal: Goal
    cart: list[tuple[int, str, str]] = field(default_factory=list)  # (pid, colour, size)
    order: tuple[int, str, str] | None = None


class ShopServer:
    """The shop for one env instance: a daemon thread serving ``127.0.0.1`` on a free port."""

    def __init__(self, cat: Catalogue, page_size: int = 10) -> None:
        self.catalogue, self.page_size = cat, page_size
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._count = 0
        handler = type("ShopHandler", (_Handler,), {"shop": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="webshop-http", daemon=True)
        self._thread.start()

    def open_session(self, goal: Goal) -> str:
        """A fresh session (empty cart) for ``goal``; returns the URL of its home page."""
        with self._lock:
            self._count += 1
            token = f"s{self._count}"
            self._sessions[token] = Session(goal)
        return f"http://127.0.0.1:{self.port}/{token}/"

    def session(self, token: str) -> Session:
        with self._lock:
            return self._sessions[token]

    def drop_session(self, token: str) -> None:
        with self._lock:
            self._sessions.pop(token, None)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ pages (called under the lock)

    def page(self, token: str, s: Session, route: str, q: dict[str, str]) -> tuple[int, str, str]:
        """(status, title, body html) of a GET."""
        cat = self.catalogue
        if route == "":
            links = "".join(
                f'<li><a href="/{token}/search?{urlencode({"q": c.name})}">{html.escape(c.plural)}</a></li>'
                for c in CATEGORIES
            )
            return (
                200,
                "Home",
                (
                    f"<h1>Welcome to {SHOP}</h1><p>Search our {len(cat.products)} products, or browse a category:</p>"
                    f"<ul>{links}</ul>"
                ),
            )
        if route == "search":
            return self._results(token, q)
        if route.startswith("product/"):
            pid = _int(route.removeprefix("product/"))
            if pid is None or not 0 <= pid < len(cat.products):
                return 404, "Not found", "<h1>Not found</h1><p>There is no such product.</p>"
            return self._product(token, cat.products[pid], q)
        if route == "cart":
            return 200, "Cart", self._cart(token, s)
        if route == "checkout":
            return 200, "Checkout", self._checkout(token, s)
        if route == "done" and s.order is not None:
            p = cat.products[s.order[0]]
            return (
                200,
                "Order placed",
                (
                    f"<h1>Order placed</h1><p>Thank you! You bought the {html.escape(p.name)} "
                    f"(colour {s.order[1]}, size {html.escape(s.order[2])}) for {p.price}.</p>"
                ),
            )
        return 404, "Not found", "<h1>Not found</h1><p>This page does not exist.</p>"

    def _results(self, token: str, q: dict[str, str]) -> tuple[int, str, str]:
        query = q.get("q", "").strip()
        found = self.catalogue.search(query)
        pages = max(1, -(-len(found) // self.page_size))
        page = min(max(_int(q.get("page", "1")) or 1, 1), pages)
        shown = found[(page - 1) * self.page_size : page * self.page_size]
        title = f"Results for &quot;{html.escape(query)}&quot;"
        if not found:
            return 200, "Results", f"<h1>{title}</h1><p>No products match your search.</p>"
        items = "".join(
            f'<li><a href="/{token}/product/{p.pid}?{urlencode({"q": query, "page": page})}">{html.escape(p.name)}'
            f"</a> <span>{p.price}</span></li>"
            for p in shown
        )
        nav = []
        if page > 1:
            nav.append(f'<a href="/{token}/search?{urlencode({"q": query, "page": page - 1})}">Previous page</a>')
        if page < pages:
            nav.append(f'<a href="/{token}/search?{urlencode({"q": query, "page": page + 1})}">Next page</a>')
        return (
            200,
            "Results",
            (
                f"<h1>{title}</h1><p>Page {page} of {pages} ({len(found)} products)</p>"
                f'<ul class="results">{items}</ul><p>{" ".join(nav)}</p>'
            ),
        )

    def _product(self, token: str, p: Product, q: dict[str, str]) -> tuple[int, str, str]:
        colour = q.get("colour", "") if q.get("colour") in p.colours else ""
        size = q.get("size", "") if q.get("size") in p.sizes else ""
        back: dict[str, str] = {k: q[k] for k in ("q", "page") if k in q}

        def option(kind: str, value: str, chosen: str) -> str:
            params = {**back, "colour": colour, "size": size, kind: value}
            href = f"/{token}/product/{p.pid}?{urlencode(params)}"
            pressed = "true" if value == chosen else "false"
            return (
                f'<a role="button" data-kind="{kind}" aria-pressed="{pressed}" href="{href}">{html.escape(value)}</a>'
            )

        error = f'<p class="error">{html.escape(q["error"])}</p>' if q.get("error") in _ERRORS else ""
        back_link = f'<p><a href="/{token}/search?{urlencode(back)}">Back to results</a></p>' if "q" in back else ""
        hidden = "".join(
            f'<input type="hidden" name="{k}" value="{html.escape(v)}">'
            for k, v in {"pid": str(p.pid), "colour": colour, "size": size, **back}.items()
        )
        return (
            200,
            p.name,
            (
                f"{back_link}<h1>{html.escape(p.name)}</h1>{error}"
                f"<p>Price: {p.price}</p><p>Rating: {p.rating} of 5 stars</p>"
                f"<p>Material: {p.material}</p><p>Features: {html.escape(', '.join(p.features))}</p>"
                f'<div class="options">Colour: {"".join(option("colour", c, colour) for c in p.colours)}</div>'
                f'<div class="options">Size: {"".join(option("size", z, size) for z in p.sizes)}</div>'
                f'<form method="post" action="/{token}/cart/add">{hidden}<button>Add to cart</button></form>'
                f"<h2>Description</h2><p>{html.escape(p.description)}</p>"
            ),
        )

    def _cart(self, token: str, s: Session) -> str:
        if not s.cart:
            return f'<h1>Cart</h1><p>Your cart is empty.</p><p><a href="/{token}/">Continue shopping</a></p>'
        rows = []
        for i, (pid, colour, size) in enumerate(s.cart):
            p = self.catalogue.products[pid]
            rows.append(
                f"<li>{html.escape(p.name)}, colour {colour}, size {html.escape(size)}, {p.price} "
                f'<form method="post" action="/{token}/cart/remove" style="display:inline">'
                f'<input type="hidden" name="index" value="{i}"><button>Remove</button></form></li>'
            )
        total = sum(self.catalogue.products[pid].price_cents for pid, _, _ in s.cart)
        return (
            f"<h1>Cart</h1><ul>{''.join(rows)}</ul><p>Total: {dollars(total)}</p>"
            f'<form method="get" action="/{token}/checkout"><button>Checkout</button></form>'
            f'<p><a href="/{token}/">Continue shopping</a></p>'
        )

    def _checkout(self, token: str, s: Session) -> str:
        if len(s.cart) != 1:
            why = (
                "Your cart is empty."
                if not s.cart
                else (f"An order holds exactly one item; your cart has {len(s.cart)}. Remove the others first.")
            )
            return f'<h1>Checkout</h1><p>{why}</p><p><a href="/{token}/cart">Back to cart</a></p>'
        pid, colour, size = s.cart[0]
        p = self.catalogue.products[pid]
        return (
            f"<h1>Checkout</h1><p>Item: {html.escape(p.name)}, colour {colour}, size {html.escape(size)}</p>"
            f"<p>Price: {p.price}. Shipping: free.</p>"
            f'<form method="post" action="/{token}/order"><button>Place order</button></form>'
            f'<p><a href="/{token}/cart">Back to cart</a></p>'
        )

    def post(self, token: str, s: Session, route: str, form: dict[str, str]) -> str:
        """Apply a POST; returns the route to redirect to."""
        if s.order is not None:  # the order is placed: nothing changes any more
            return "done"
        if route == "cart/add":
            pid = _int(form.get("pid", ""))
            if pid is None or not 0 <= pid < len(self.catalogue.products):
                return "cart"
            p = self.catalogue.products[pid]
            colour, size = form.get("colour", ""), form.get("size", "")
            missing = [
                name
                for name, v, allowed in (("colour", colour, p.colours), ("size", size, p.sizes))
                if v not in allowed
            ]
            if missing:
                back: dict[str, str] = {k: form[k] for k in ("q", "page") if k in form}
                params = {**back, "colour": colour, "size": size, "error": _ERROR_FOR[tuple(missing)]}
                return f"product/{pid}?{urlencode(params)}"
            s.cart.append((pid, colour, size))
            return "cart"
        if route == "cart/remove":
            i = _int(form.get("index", ""))
            if i is not None and 0 <= i < len(s.cart):
                del s.cart[i]
            return "cart"
        if route == "order":
            if len(s.cart) != 1:
                return "checkout"
            s.order = s.cart[0]
            return "done"
        return "missing"


_ERROR_FOR = {
    ("colour",): "Please choose a colour.",
    ("size",): "Please choose a size.",
    ("colour", "size"): "Please choose a colour and a size.",
}
_ERRORS = set(_ERROR_FOR.values())


def _int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) < 10 else None


class _Handler(BaseHTTPRequestHandler):
    shop: ShopServer
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per browser tab, not per request

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's signature
        pass  # a line per request would flood the worker's stderr

    def _route(self) -> tuple[str, Session | None, str, dict[str, str]]:
        url = urlsplit(self.path)
        token, _, route = url.path.lstrip("/").partition("/")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self.shop._lock:
            s = self.shop._sessions.get(token)
        return token, s, route, query

    def do_GET(self) -> None:  # noqa: N802 - the base's naming
        token, s, route, query = self._route()
        with self.shop._lock:
            if s is None:
                status, title, body = 404, "Not found", "<h1>Not found</h1><p>No such session.</p>"
            else:
                status, title, body = self.shop.page(token, s, route, query)
                cart = len(s.cart)
        if s is not None:
            search = html.escape(query.get("q", "")) if route == "search" else ""
            header = (
                f'<header><a href="/{token}/">{SHOP}</a>'
                f'<form method="get" action="/{token}/search"><input name="q" aria-label="search" value="{search}">'
                f'<button>Search</button></form><a href="/{token}/cart">Cart ({cart})</a></header>'
            )
            body = f"{header}<main>{body}</main>"
        self._send(
            status,
            f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)} - {SHOP}</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>",
        )

    def do_POST(self) -> None:  # noqa: N802
        token, s, route, _ = self._route()
        length = _int(self.headers.get("Content-Length", "0")) or 0
        if length > 65536:
            self._send(413, "form too large")
            return
        form = {k: v[-1] for k, v in parse_qs(self.rfile.read(length).decode("utf-8", "replace")).items()}
        if s is None:
            self._send(404, "no such session")
            return
        with self.shop._lock:
            target = self.shop.post(token, s, route, form)
        self.send_response(303)
        self.send_header("Location", f"/{quote(token)}/{target}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")  # "go back" must show the cart as it is now
        self.end_headers()
        self.wfile.write(data)
