"""``agentgym config --explain``: every config field with its type, default, bounds and docstring.

    print(explain(Config))          # one block per field, dotted names, sections in order

Read from the pydantic models themselves (annotations, ``Field`` constraints and attribute
docstrings), so it cannot drift from agentgym/config.py.
"""

from __future__ import annotations

import textwrap
import typing

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

_OPS = ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<"))


def _type_name(tp: object) -> str:
    return (getattr(tp, "__name__", None) if not typing.get_args(tp) else None) or str(tp).replace("typing.", "")


def _bounds(metadata: list[object]) -> str:
    parts = [f"{sym} {getattr(m, attr)}" for m in metadata for cls, attr, sym in _OPS if isinstance(m, cls)]
    return ", ".join(parts)


def explain(model: type[BaseModel], prefix: str = "") -> str:
    """The fields of ``model`` (recursing into sections) as text blocks."""
    out: list[str] = []
    for name, f in model.model_fields.items():
        key = f"{prefix}{name}"
        tp = f.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            doc = (tp.__doc__ or "").strip()
            out.append(f"[{key}]" + (f"\n    {doc.splitlines()[0]}" if doc else ""))
            out.append(explain(tp, key + "."))
            continue
        default = str(f.default) if not isinstance(f.default, (str, list, dict, tuple)) else repr(f.default)
        line = f"{key}: {_type_name(tp)} = {default}"
        b = _bounds(f.metadata)
        out.append(line + (f"   ({b})" if b else "") + ("\n" + textwrap.indent(textwrap.dedent(f.description).strip(), "    ") if f.description else ""))
    return "\n".join(x for x in out if x)
