"""JSON-value helpers the generated validators call: JSON Schema's notion of types and equality,
which differs from Python's (True is not 1 there, and 1.0 is an integer)."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from engram.errors import Problem


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_integer(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _exact(x: int | float) -> Fraction:
    """The decimal a JSON number was written as (its shortest repr), exactly: 0.1 is 1/10 here."""
    return Fraction(x) if isinstance(x, int) else Fraction(Decimal(repr(x)))


def _multiple_of(v: int | float, m: int | float) -> bool:
    """multipleOf in exact decimal arithmetic: 0.3 is a multiple of 0.1, and 1e308 of nothing small."""
    if isinstance(v, int) and isinstance(m, int):
        return v % m == 0
    if not math.isfinite(v):  # 1e999 and NaN, which Python's json reads: multiples of nothing
        return False
    return _exact(v) % _exact(m) == 0


def _key(v: Any) -> Any:
    """A hashable key that two JSON values share exactly when _json_equal says they are equal."""
    if isinstance(v, bool):
        return ("bool", v)
    if _is_number(v):
        return ("number", int(v) if isinstance(v, float) and v.is_integer() else v)
    if isinstance(v, list):
        return ("array", tuple(_key(x) for x in v))
    if isinstance(v, dict):
        return ("object", frozenset((k, _key(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def _unique(items: list[Any]) -> bool:
    """uniqueItems in linear time (a pairwise check took minutes for 20,000 items)."""
    seen: set[Any] = set()
    for item in items:
        key = _key(item)
        if key in seen:
            return False
        seen.add(key)
    return True


def _int_text(v: int) -> str:
    """repr(v), or its size where the digits would be too many to print (or for Python to convert)."""
    if v.bit_length() <= 1000:
        return repr(v)
    return f"an integer of about {int(v.bit_length() * 0.30103) + 1:,} digits"


def _describe(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str):
        return f"the string {v!r}"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, int):
        return _int_text(v)
    return "an array" if isinstance(v, list) else repr(v)


def _got(v: Any) -> str:
    return "; got " + _describe(v)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _at(doc: Any, parts: tuple[str, ...]) -> Any:
    """The value at a path of keys, or None where the path leaves the document."""
    for part in parts:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _details(check: Callable[[Any, str, list[Problem]], bool], v: Any) -> str:
    """What `check` finds wrong with `v`, as 'field: message; ...' for a rule's message."""
    scratch: list[Problem] = []
    check(v, "", scratch)
    return "; ".join(f"{p.path.lstrip('/') or 'value'}: {p.message}" for p in scratch)


class _BoundedRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        return _int_text(x)


_REPR = _BoundedRepr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 80, 80


class _Shown:
    """Wraps a user value for messages: `{value!r}` prints a bounded repr, whatever the input's size."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return _REPR.repr(self.value)


def _shown(value: Any) -> _Shown:
    return _Shown(value)
