"""JSON Schema patterns mean what ECMAScript means (engram.validation.ecma): the u grammar, else Annex B,
matched on code points. Exact expectations for the dialect differences Python's `re` had, and a
differential run against a real ECMAScript engine (node, where installed: Debian's `nodejs`) over a fixed
corpus and 3,000 seeded random patterns."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import regex

from engram.validation.ecma import EcmaSyntaxError, translate, translate_strict
from engram.validation.patterns import is_instance_pattern, is_pattern

NODE = shutil.which("node") or shutil.which("nodejs")
needs_node = pytest.mark.skipif(NODE is None, reason="needs an ECMAScript engine: apt install nodejs")


def answer(pattern: str, strings: list[str]) -> dict[str, object]:
    """As ecma_node.js answers: which grammar read the pattern, and whether it matches each string."""
    try:
        text, u = translate_strict(pattern), True
    except EcmaSyntaxError:
        try:
            text, u = translate(pattern), False
        except EcmaSyntaxError:
            return {"u": False, "annexb": False, "matches": None}
    compiled = regex.compile(text)
    return {"u": u, "annexb": not u, "matches": [compiled.search(s) is not None for s in strings]}


def matches(pattern: str, text: str) -> bool:
    return regex.compile(translate(pattern)).search(text) is not None


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        (r"\D", "\u0663", True),  # an Arabic digit is not an ECMAScript digit, in a class or not
        (r"[\D]", "\u0663", True),
        (r"\d", "\u0663", False),
        (r"^.$", "\r", False),
        (r"^.$", "\u2028", False),
        (r"^.$", "\U0001f600", True),  # one code point
        (r"^\s$", "\ufeff", True),
        (r"^\s$", "\u0085", False),
        (r"\bfoo\b", "\u00e9foo\u00e9", True),  # é is not a word character to ECMAScript's \b
        (r"^abc$", "abc\n", False),
        (r"[^]", "\n", True),
        (r"[]", "a", False),
        (r"\cA", "\x01", True),
        (r"^(?<x>a)\k<x>$", "aa", True),
        (r"^a{,2}$", "a{,2}", True),  # Annex B: not a quantifier, text
        (r"\Z", "Z", True),  # Annex B identity escape, not Python's end of string
        (r"^(a)|\1b$", "b", True),  # a group that has not matched: the empty string
        (r"^[[:alpha:]]$", ":]", True),  # a class of [ : a l p h, then a ], not a POSIX class
        (r"^[[:alpha:]]$", "a", False),
        (r"^[\d-z]$", "-", True),
        (r"\N{DIGIT ONE}", "1", False),  # Annex B: N and braces as text, not Python's named character
        (r"^\N{DIGIT ONE}$", "N{DIGIT ONE}", True),
    ],
)
def test_ecmascript_meaning(pattern: str, text: str, expected: bool) -> None:
    assert matches(pattern, text) is expected


@pytest.mark.parametrize(
    "pattern", [r"(?i)a", r"a++", r"a**", r"(", r"[z-a]", r"a{2,1}", r"(?P<n>a)", r"(?<a>x)(?<a>y)", r"(?<=a)+"]
)
def test_python_only_or_invalid_syntax_is_refused(pattern: str) -> None:
    with pytest.raises(EcmaSyntaxError, match=r"^not an ECMA-262 pattern with the u flag: .+ at offset \d+$"):
        translate(pattern)
    assert not is_pattern(pattern)


def test_the_regex_format_takes_the_u_grammar_only() -> None:
    assert is_pattern(r"a{,2}") and not is_instance_pattern(r"a{,2}")  # a schema's pattern may use Annex B
    assert is_pattern(r"\&") and not is_instance_pattern(r"\&")
    assert is_instance_pattern(r"^\p{Lu}\u{1F600}[\-a]$")


CORPUS = [
    (r"\d", ["5", "\u0663", "a"]),
    (r"^\s$", ["\u00a0", "\ufeff", "\u0085", " ", "\u2003", "\u180e"]),
    (r"\p{Script=Greek}", ["\u03b1", "a"]),
    (r"^\u{1F600}$", ["\U0001f600"]),
    (r"^\uD83D\uDE00$", ["\U0001f600"]),
    (r"\1(a)", ["a", "aa"]),
    (r"^(a\1)b$", ["ab", "aab"]),  # a reference inside its own group: not captured yet
    (r"^(?<n>a\k<n>)$", ["a"]),
    (r"[\b]", ["\b", "b"]),
    (r"\01", ["\x01"]),
    (r"\8", ["8"]),
    (r"(?=a)*b", ["b", "ab"]),
    (r"(?<=a+)c", ["aac", "c"]),
    (r"[\c1]", ["\x11"]),
    (r"\c1", ["\\c1"]),
    (r"[a-\d]", ["-", "a", "5"]),
    (r"\k", ["k"]),
    (r"(?<n>a)\k", ["a"]),
    (r"\u004", ["u004"]),
    (r"^[^\W]+$", ["ab_1", "\u00e9"]),
    (r"\12", ["\n"]),
    (r"(a)\12", ["a\n", "aa2"]),
    (r"[\12]", ["\n"]),
    (r"\c", ["\\c"]),
    (r"[\c]", ["\\", "c"]),
    (r"\P{L}", ["1", "a"]),
    (r"[\p{N}a]", ["5", "a", "b"]),
    (r"a{1}{2}", []),
    (r"\v\f\t", ["\x0b\x0c\t"]),
]
TOKENS = [
    "a", "b", "\\d", "\\D", "\\w", "\\W", "\\s", "\\S", "\\b", "\\B", ".", "^", "$", "[ab]", "[^a]", "[a-c]",
    "[\\d]", "[^\\s]", "[\\W-]", "(", ")", "(?:", "(?=", "(?!", "(?<=", "(?<!", "|", "*", "+", "?", "*?", "{2}",
    "{1,}", "{,2}", "{0,1}", "{", "}", "]", "[", "\\1", "\\2", "(?<n>", "\\k<n>", "\\u0041", "\\x41", "\\cA", "\\0",
    "\\-", "\\/", "\\.", "\\p{L}", "\\P{Nd}", "\\u{1F600}", "\u00e9", "\\uD83D", "[^]", "[]", "\\c", "\\8", "\\12",
    "-", "\\&", "\\a", "\\z",
]  # fmt: skip
ALPHABET = [
    "a",
    "b",
    "A",
    "1",
    "\u0663",
    "\u00e9",
    " ",
    "\n",
    "\r",
    "\u2028",
    "\u00a0",
    "_",
    "-",
    "{",
    "}",
    "]",
    "\x01",
    "/",
    ".",
]


def random_cases(count: int, seed: int) -> list[tuple[str, list[str]]]:
    """Seeded patterns of 1-7 tokens, each with six strings of 0-6 characters (the Basic Multilingual
    Plane only: Annex B patterns match UTF-16 code units in ECMAScript, code points here)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        pattern = "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 7)))
        strings = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 6))) for _ in range(6)]
        cases.append((pattern, strings))
    return cases


@needs_node
def test_every_pattern_agrees_with_an_ecmascript_engine() -> None:
    cases = CORPUS + random_cases(3000, seed=23)
    lines = "".join(json.dumps({"pattern": p, "strings": s}) + "\n" for p, s in cases)
    done = subprocess.run(
        [str(NODE), str(Path(__file__).with_name("ecma_node.js"))],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    theirs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(theirs) == len(cases)
    differ = [(p, s, t, answer(p, s)) for (p, s), t in zip(cases, theirs, strict=True) if t != answer(p, s)]
    assert differ == []
    read = [t for t in theirs if t["matches"] is not None]
    assert len(read) > 1000 and any(t["annexb"] for t in read)  # both grammars exercised
