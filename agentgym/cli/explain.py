"""``agentgym config --explain``: every config field with its type, default, bounds and docstring.

    print(explain(Config))          # one block per field, dotted names, sections in order

Read from the pydantic models themselves (annotations, ``Field`` constraints and attribute
docstrings), so it cannot drift from agentgym/config/__init__.py and its section modules.
"""

from __future__ import annotations

import textwrap
import types
import typing

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

_OPS = ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<"))


def _constraints(metadata: list[object]) -> list[object]:
    """Bounds of an ``Annotated``: annotated-types objects, or those inside a pydantic ``Field``."""
    return [c for m in metadata for c in (m.metadata if isinstance(m, FieldInfo) else [m])]


def _type_name(tp: object, bounds: list[object] | None = None) -> str:
    """``tp`` as written in the config modules, without pydantic's ``Annotated`` wrappers: an ``X | None``
    member's bounds go to ``bounds`` (shown beside the default), a nested one's inline (``int>=1``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        inner, cons = _type_name(args[0]), _constraints(list(tp.__metadata__))  # type: ignore[attr-defined]  # an Annotated type's, which typing does not declare
        if bounds is not None:
            bounds.extend(cons)
            return inner
        return inner + "".join(
            f"{sym}{getattr(c, attr)}" for c in cons for cls, attr, sym in _OPS if isinstance(c, cls)
        )
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a, bounds) for a in args)
    if origin is not None and origin is not typing.Literal and args:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"
    return (getattr(tp, "__name__", None) if not args else None) or str(tp).replace("typing.", "")


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
        nested: list[object] = []
        line = f"{key}: {_type_name(tp, nested)} = {default}"
        b = _bounds([*f.metadata, *nested])
        out.append(
            line
            + (f"   ({b})" if b else "")
            + ("\n" + textwrap.indent(textwrap.dedent(f.description).strip(), "    ") if f.description else "")
        )
    return "\n".join(x for x in out if x)
