"""Checks for the common `format` values, used only where a schema opts in to format assertion
(`"x-engram-format-assertion": true`); by default 2020-12 treats `format` as an annotation. Each check
accepts non-strings, as the spec says."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from datetime import date

from engram.validation.patterns import is_instance_pattern

_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[zZ]|([+-])(\d{2}):(\d{2}))", re.ASCII)
_DURATION = re.compile(
    r"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))?"
    r"|T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)|\d+W)",
    re.ASCII,
)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", re.ASCII)
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*", re.ASCII)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:", re.ASCII)
_POINTER = re.compile(r"(?:/(?:[^~/]|~[01])*)*")


def _date(text: str) -> bool:
    m = _DATE.fullmatch(text)
    if m is None:
        return False
    try:
        date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def _time(text: str) -> bool:
    m = _TIME.fullmatch(text)
    if m is None:
        return False
    hour, minute, second = int(m[1]), int(m[2]), int(m[3])
    off_h, off_m = (int(m[6]), int(m[7])) if m[5] else (0, 0)
    if hour > 23 or minute > 59 or second > 60 or off_h > 23 or off_m > 59:
        return False
    if second == 60:  # a leap second exists only at 23:59:60 UTC
        sign = -1 if m[5] == "+" else 1
        utc = (hour * 60 + minute + sign * (off_h * 60 + off_m)) % (24 * 60)
        return utc == 23 * 60 + 59
    return True


def _date_time(text: str) -> bool:
    day, sep, clock = text.partition("T") if "T" in text else text.partition("t")
    return bool(sep) and _date(day) and _time(clock)


def _email(text: str) -> bool:
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain or any(c.isspace() for c in text):
        return False
    if local.startswith(".") or local.endswith(".") or ".." in local:
        return False
    if domain.startswith("[") and domain.endswith("]"):
        return _ipv4(domain[1:-1]) or (domain[1:].lower().startswith("ipv6:") and _ipv6(domain[6:-1]))
    return _hostname(domain)


def _hostname(text: str) -> bool:
    name = text[:-1] if text.endswith(".") else text
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return text.isascii()


def _ipv6(text: str) -> bool:
    if "%" in text or not text.isascii():
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _uri(text: str) -> bool:
    return bool(_SCHEME.match(text)) and _uri_reference(text)


def _uri_reference(text: str) -> bool:
    return _URI_CHARS.fullmatch(text) is not None and text.count("#") <= 1


CHECKS: dict[str, Callable[[str], bool]] = {
    "date": _date,
    "time": _time,
    "date-time": _date_time,
    "duration": lambda text: _DURATION.fullmatch(text) is not None,
    "email": _email,
    "hostname": _hostname,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "uri": _uri,
    "uri-reference": _uri_reference,
    "uuid": lambda text: _UUID.fullmatch(text) is not None,
    "regex": is_instance_pattern,
    "json-pointer": lambda text: _POINTER.fullmatch(text) is not None,
}


def format_check(name: str) -> Callable[[object], bool]:
    """The assertion for one format: true for values of other types, as for every format."""
    check = CHECKS[name]
    return lambda v: not isinstance(v, str) or check(v)
