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
_POINTER = re.compile(r"(?:/(?:[^~/]|~[01])*)*")
# draft-bhutton-relative-json-pointer-00: a prefix, an optional index manipulation, then # or a pointer
_RELATIVE_POINTER = re.compile(r"(?:0|[1-9][0-9]*)(?:[+-](?:0|[1-9][0-9]*))?(?:#|(?:/(?:[^~/]|~[01])*)*)", re.ASCII)


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


def _references(iri: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """RFC 3986 (URI, URI-reference) or RFC 3987 (IRI, IRI-reference, with ucschar and iprivate), from
    their ABNF; an IP-literal's address is checked apart (_host)."""
    ucs = (
        "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd\U00020000-\U0002fffd"
        "\U00030000-\U0003fffd\U00040000-\U0004fffd\U00050000-\U0005fffd\U00060000-\U0006fffd"
        "\U00070000-\U0007fffd\U00080000-\U0008fffd\U00090000-\U0009fffd\U000a0000-\U000afffd"
        "\U000b0000-\U000bfffd\U000c0000-\U000cfffd\U000d0000-\U000dfffd\U000e1000-\U000efffd"
        if iri
        else ""
    )
    private = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd" if iri else ""
    unreserved = f"A-Za-z0-9\\-._~{ucs}"
    pct = "%[0-9A-Fa-f]{2}"
    pchar = f"(?:[{unreserved}!$&'()*+,;=:@]|{pct})"
    authority = f"(?:(?:[{unreserved}!$&'()*+,;=:]|{pct})*@)?(?P<host>\\[[^\\]/]*\\]|(?:[{unreserved}!$&'()*+,;=]|{pct})*)(?::[0-9]*)?"
    tail = f"(?:\\?(?:{pchar}|[/?{private}])*)?(?:#(?:{pchar}|[/?])*)?"
    segment_nz_nc = f"(?:[{unreserved}!$&'()*+,;=@]|{pct})+"
    absolute = f"[A-Za-z][A-Za-z0-9+.\\-]*:(?://{authority}(?:/{pchar}*)*|/(?:{pchar}+(?:/{pchar}*)*)?|{pchar}+(?:/{pchar}*)*|){tail}"
    relative = f"(?://{authority}(?:/{pchar}*)*|/(?:{pchar}+(?:/{pchar}*)*)?|{segment_nz_nc}(?:/{pchar}*)*|){tail}"
    return re.compile(absolute), re.compile(relative)


_URI, _URI_RELATIVE = _references(iri=False)
_IRI, _IRI_RELATIVE = _references(iri=True)


def _host(match: re.Match[str] | None) -> bool:
    """An IP-literal host holds an IPv6 address (no zone) or an IPvFuture."""
    if match is None:
        return False
    host = match.group("host")
    if host is None or not host.startswith("["):
        return True
    inner = host[1:-1]
    if inner[:1] in ("v", "V"):
        return re.fullmatch(r"[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+", inner) is not None
    return _ipv6(inner)


def _reference(absolute: re.Pattern[str], relative: re.Pattern[str], text: str, relative_ok: bool) -> bool:
    return _host(absolute.fullmatch(text)) or (relative_ok and _host(relative.fullmatch(text)))


_LABEL_SEPARATORS = re.compile("[.\u3002\uff0e\uff61]")  # RFC 3490 3.1: all four are dots


def _idn_hostname(text: str) -> bool:
    """IDNA2008 (RFC 5890-5893), each label checked by the idna package (code points, contextual rules,
    hyphens, combining marks, bidi; an A-label must be Punycode of a valid U-label), at most 63
    characters a label and 253 in all, no empty label (so no leading or trailing dot), as the JSON
    Schema suite reads it."""
    import idna  # here: only a schema that asserts an IDN format needs it

    labels = _LABEL_SEPARATORS.split(text)
    if len(text) > 253 or any(not label or len(label) > 63 for label in labels):
        return False
    try:
        for label in labels:
            if label[:4].lower() == "xn--":
                idna.decode(label)
            else:
                idna.core.check_label(label)
    except (idna.IDNAError, UnicodeError, ValueError):
        return False
    return True


def _idn_email(text: str) -> bool:
    local, at, domain = text.rpartition("@")
    if not at or not local or any(c.isspace() for c in text):
        return False
    if local.startswith(".") or local.endswith(".") or ".." in local:
        return False
    if domain.startswith("[") and domain.endswith("]"):
        return _email(f"a@{domain}")
    return _idn_hostname(domain)


_VARNAME = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*"
_VARSPEC = f"{_VARNAME}(?::[1-9][0-9]{{0,3}}|\\*)?"
# RFC 6570: literals (an apostrophe too, as the JSON Schema suite reads it), and expressions with the
# operators of levels 2 and 3 (those it reserves for later are not valid yet)
_TEMPLATE = re.compile(
    f'(?:[^\x00-\x20"%<>\\\\^`{{|}}\x7f]|%[0-9A-Fa-f]{{2}}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*'
)


CHECKS: dict[str, Callable[[str], bool]] = {
    "date": _date,
    "time": _time,
    "date-time": _date_time,
    "duration": lambda text: _DURATION.fullmatch(text) is not None,
    "email": _email,
    "hostname": _hostname,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "idn-email": _idn_email,
    "idn-hostname": _idn_hostname,
    "uri": lambda text: _reference(_URI, _URI_RELATIVE, text, relative_ok=False),
    "uri-reference": lambda text: _reference(_URI, _URI_RELATIVE, text, relative_ok=True),
    "iri": lambda text: _reference(_IRI, _IRI_RELATIVE, text, relative_ok=False),
    "iri-reference": lambda text: _reference(_IRI, _IRI_RELATIVE, text, relative_ok=True),
    "uri-template": lambda text: _TEMPLATE.fullmatch(text) is not None,
    "uuid": lambda text: _UUID.fullmatch(text) is not None,
    "regex": is_instance_pattern,
    "json-pointer": lambda text: _POINTER.fullmatch(text) is not None,
    "relative-json-pointer": lambda text: _RELATIVE_POINTER.fullmatch(text) is not None,
}


def format_check(name: str) -> Callable[[object], bool]:
    """The assertion for one format: true for values of other types, as for every format."""
    check = CHECKS[name]
    return lambda v: not isinstance(v, str) or check(v)
