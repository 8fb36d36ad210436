"""Page -> observation text, and the agent's action text -> an action.

``OBSERVE_JS`` runs in the page (``page.evaluate``): it numbers every interactive element in
document order (``data-agid``, so the same page always gets the same ids and an action can find
its element again), and writes the part of the page inside the viewport as lines, interactive
elements as ``[id] role "name"``, in the manner of an accessibility tree:

    Agentshop | Results
    [1] link "Agentshop"
    [2] textbox "search" value="red cotton t-shirt"
    [3] button "Search"
    [4] link "Cart (0)"
    Results for "red cotton t-shirt"
    [5] link "Granite v-neck cotton t-shirt" $18.00
    ...
    (more below: scroll down)

Action grammar (case-insensitive; an optional leading "Action:" and the last such line of a
longer answer are accepted, so an agent may think aloud first):

    click [ID]
    type [ID] TEXT            (TEXT ends with " [enter]" to press Enter afterwards)
    scroll down | scroll up
    go back
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OBSERVE_JS = r"""
() => {
  const SEL = 'a[href], button, input:not([type=hidden]), select, textarea, [role=button]';
  const vh = window.innerHeight;
  const lines = [];
  const elements = {};
  let cur = [];
  let next = 0;
  const flush = () => {
    const s = cur.join(' ').replace(/\s+/g, ' ').trim();
    if (s) lines.push(s);
    cur = [];
  };
  const inView = (r) => r.width > 0 && r.height > 0 && r.bottom > 0 && r.top < vh;
  const clean = (s) => (s || '').replace(/\s+/g, ' ').trim();
  const roleOf = (el) => {
    const r = el.getAttribute('role');
    if (r) return r;
    if (el.tagName === 'A') return 'link';
    if (el.tagName === 'BUTTON') return 'button';
    if (el.tagName === 'SELECT') return 'combobox';
    if (el.tagName === 'TEXTAREA') return 'textbox';
    const t = (el.getAttribute('type') || 'text').toLowerCase();
    if (t === 'submit' || t === 'button') return 'button';
    if (t === 'checkbox' || t === 'radio') return t;
    return 'textbox';
  };
  const nameOf = (el) => clean(el.getAttribute('aria-label') || el.innerText
                               || (el.tagName === 'INPUT' && el.type === 'submit' ? el.value : '')
                               || el.getAttribute('placeholder') || el.getAttribute('name'));
  const walk = (node) => {
    for (const c of node.childNodes) {
      if (c.nodeType === Node.TEXT_NODE) {
        const range = document.createRange();
        range.selectNodeContents(c);
        if (inView(range.getBoundingClientRect())) cur.push(c.textContent);
        continue;
      }
      if (c.nodeType !== Node.ELEMENT_NODE) continue;
      if (['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'HEAD'].includes(c.tagName)) continue;
      const style = getComputedStyle(c);
      if (style.display === 'none' || style.visibility === 'hidden') continue;
      if (c.matches(SEL)) {
        const id = ++next;
        c.setAttribute('data-agid', String(id));
        if (!inView(c.getBoundingClientRect())) continue;
        const role = roleOf(c);
        const name = nameOf(c);
        let text = `[${id}] ${role} ${JSON.stringify(name)}`;
        if (role === 'textbox' && c.value) text += ` value=${JSON.stringify(c.value)}`;
        const selected = c.getAttribute('aria-pressed') === 'true' || c.checked === true;
        if (selected) text += ' (selected)';
        if (c.disabled) text += ' (disabled)';
        cur.push(text);
        elements[id] = {role, name, selected, kind: c.getAttribute('data-kind') || ''};
        continue;
      }
      const inline = style.display === 'inline' || style.display === 'inline-block';
      if (!inline) flush();
      walk(c);
      if (!inline) flush();
    }
  };
  walk(document.body);
  flush();
  const below = document.documentElement.scrollHeight - (window.scrollY + vh) > 1;
  const above = window.scrollY > 0;
  return {title: document.title, lines, elements, above, below};
}
"""


@dataclass(frozen=True)
class Element:
    role: str
    name: str
    selected: bool
    kind: str  # the shop's data-kind ("colour", "size") for the expert; "" elsewhere


@dataclass(frozen=True)
class Page:
    """One observation of the page: the text the agent sees and the elements it can act on."""

    text: str
    elements: dict[int, Element]
    above: bool
    below: bool


def page_from_js(result: dict) -> Page:
    """Build a ``Page`` from what ``OBSERVE_JS`` returned."""
    lines = [str(result["title"])]
    if result["above"]:
        lines.append("(more above: scroll up)")
    lines += result["lines"]
    if result["below"]:
        lines.append("(more below: scroll down)")
    elements = {
        int(k): Element(v["role"], v["name"], bool(v["selected"]), v["kind"]) for k, v in result["elements"].items()
    }
    return Page("\n".join(lines), elements, bool(result["above"]), bool(result["below"]))


MAX_TYPED = 200
"""Longest text a ``type`` action may enter."""


@dataclass(frozen=True)
class Click:
    id: int


@dataclass(frozen=True)
class Type:
    id: int
    text: str
    enter: bool


@dataclass(frozen=True)
class Scroll:
    down: bool


@dataclass(frozen=True)
class GoBack:
    pass


Command = Click | Type | Scroll | GoBack

ACTIONS_HELP = 'click [ID] | type [ID] TEXT (end with " [enter]" to press Enter) | scroll down | scroll up | go back'

_VERB = re.compile(r"^\s*(?:action\s*:\s*)?(click|type|scroll|go\s+back)\b", re.IGNORECASE)
_CLICK = re.compile(r"^click\s*\[(\d{1,6})\]$", re.IGNORECASE)
_TYPE = re.compile(r"^type\s*\[(\d{1,6})\]\s?(.*?)(\s*\[enter\])?$", re.IGNORECASE | re.DOTALL)
_SCROLL = re.compile(r"^scroll\s+(up|down)$", re.IGNORECASE)
_BACK = re.compile(r"^go\s+back$", re.IGNORECASE)


def parse_action(text: str) -> Command | str:
    """The action in ``text``, or a message saying what is wrong with it (an invalid action)."""
    lines = [line for line in text.splitlines() if _VERB.match(line)]
    if not lines:
        shown = text.strip()[:80]
        return f"no action found in {shown!r}; actions are: {ACTIONS_HELP}"
    line = lines[-1].strip()
    line = re.sub(r"^action\s*:\s*", "", line, flags=re.IGNORECASE).rstrip(" .")
    if m := _CLICK.match(line):
        return Click(int(m.group(1)))
    if m := _TYPE.match(line):
        typed = m.group(2).strip()
        if len(typed) >= 2 and typed[0] == typed[-1] and typed[0] in "\"'":
            typed = typed[1:-1]  # type [2] "red shirt" types the words, not the quotes
        if len(typed) > MAX_TYPED:
            return f"text to type is {len(typed)} characters long; at most {MAX_TYPED}"
        return Type(int(m.group(1)), typed, m.group(3) is not None)
    if m := _SCROLL.match(line):
        return Scroll(m.group(1).lower() == "down")
    if _BACK.match(line):
        return GoBack()
    return f"cannot read {line[:80]!r}; actions are: {ACTIONS_HELP}"
