"""ECMA-262 regular expressions, parsed as ECMAScript parses them and written out in the `regex` package's
syntax with ECMAScript's meaning. JSON Schema patterns are ECMA-262 read with the u flag; a pattern that
grammar refuses is read with the grammar of Annex B (no flag), which accepts what schemas in the wild
hold: a lone `{` or `]`, `a{,2}` as text, identity escapes such as `\\&`, legacy octal escapes. The
`regex` format accepts only the u grammar. Both are matched on code points.

What ECMAScript means, not Python: `.` matches anything but \\n, \\r, U+2028 and U+2029; `$` matches only
at the very end; `\\d`, `\\w` and `\\b` are ASCII; `\\s` is ECMAScript's white space and line
terminators; `[^]` matches any character and `[]` none; a backreference to a group that has not
matched matches the empty string. Unicode property escapes (`\\p{...}`, u grammar only) are resolved by
the `regex` package, whose names are a superset of ECMAScript's."""

from __future__ import annotations

from dataclasses import dataclass, field

from engram.errors import EngramError

SYNTAX = frozenset("^$\\.*+?()[]{}|")
WHITE = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029)]
WHITE += [(0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
DIGIT = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
CLASS_ESCAPES = {"d": DIGIT, "s": WHITE, "w": WORD}
CONTROL = {"f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}
MAX_CODE_POINT = 0x10FFFF
WORD_CLASS = "[0-9A-Z_a-z]"
BOUNDARY = f"(?:(?<={WORD_CLASS})(?!{WORD_CLASS})|(?<!{WORD_CLASS})(?={WORD_CLASS}))"
NOT_BOUNDARY = f"(?:(?<={WORD_CLASS})(?={WORD_CLASS})|(?<!{WORD_CLASS})(?!{WORD_CLASS}))"


class EcmaSyntaxError(EngramError, ValueError):
    """Not an ECMA-262 pattern under the grammar tried; the message says where and why."""


def char(code: int) -> str:
    """One code point in `regex` syntax, the same inside and outside a class."""
    return f"\\U{code:08x}"


def ranges_text(ranges: list[tuple[int, int]]) -> str:
    return "".join(char(lo) if lo == hi else f"{char(lo)}-{char(hi)}" for lo, hi in ranges)


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], 0
    for lo, hi in sorted(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = max(start, hi + 1)
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return out


@dataclass
class _Parser:
    source: str
    unicode: bool
    groups: int = 0  # capturing groups in the whole pattern (a backreference may name a later one)
    names: set[str] = field(default_factory=set)
    pos: int = 0
    seen_names: set[str] = field(default_factory=set)
    opened: int = 0  # capturing groups opened so far, numbering them as ECMAScript does
    open_groups: list[int | str] = field(default_factory=list)  # numbers and names of the groups still open

    def fail(self, why: str) -> EcmaSyntaxError:
        mode = "with the u flag" if self.unicode else "under Annex B"
        return EcmaSyntaxError(f"not an ECMA-262 pattern {mode}: {why} at offset {self.pos}")

    def peek(self, ahead: int = 0) -> str:
        at = self.pos + ahead
        return self.source[at] if at < len(self.source) else ""

    def eat(self, text: str) -> bool:
        if self.source.startswith(text, self.pos):
            self.pos += len(text)
            return True
        return False

    # -- structure --------------------------------------------------------------------------------

    def pattern(self) -> str:
        out = self.disjunction()
        if self.pos < len(self.source):
            raise self.fail(f"unmatched {self.peek()!r}")
        return out

    def disjunction(self) -> str:
        parts = [self.alternative()]
        while self.eat("|"):
            parts.append(self.alternative())
        return "|".join(parts)

    def alternative(self) -> str:
        out = []
        while self.pos < len(self.source) and self.peek() not in "|)":
            out.append(self.term())
        return "".join(out)

    def term(self) -> str:
        assertion = self.assertion()
        if assertion is not None:
            text, quantifiable = assertion
            if self.quantifier_ahead():
                if not quantifiable:
                    raise self.fail("nothing to repeat")
                return f"(?:{text}){self.quantifier()}"
            return text
        atom = self.atom()
        if self.quantifier_ahead():
            return f"(?:{atom}){self.quantifier()}"
        return atom

    def assertion(self) -> tuple[str, bool] | None:
        """(text, quantifiable) of an assertion here, or None."""
        if self.eat("^"):
            return "^", False
        if self.eat("$"):
            return r"\Z", False
        if self.eat("\\b"):
            return BOUNDARY, False
        if self.eat("\\B"):
            return NOT_BOUNDARY, False
        for opener, out in (("(?=", "(?="), ("(?!", "(?!"), ("(?<=", "(?<="), ("(?<!", "(?<!")):
            if self.eat(opener):
                inner = self.disjunction()
                if not self.eat(")"):
                    raise self.fail("unterminated group")
                # Annex B lets a lookahead (not a lookbehind) take a quantifier
                return f"{out}{inner})", not self.unicode and "<" not in opener
        return None

    def quantifier_ahead(self) -> bool:
        ch = self.peek()
        return (ch != "" and ch in "*+?") or (ch == "{" and self.braces() is not None)

    def braces(self) -> tuple[int, int | None, int] | None:
        """(min, max or None, end) of a `{n}`, `{n,}` or `{n,m}` here, else None."""
        i, s = self.pos + 1, self.source
        j = i
        while j < len(s) and s[j].isdigit() and s[j].isascii():
            j += 1
        if j == i:
            return None
        low = int(s[i:j])
        if j < len(s) and s[j] == "}":
            return low, low, j + 1
        if j >= len(s) or s[j] != ",":
            return None
        k = j + 1
        while k < len(s) and s[k].isdigit() and s[k].isascii():
            k += 1
        if k < len(s) and s[k] == "}":
            return low, (int(s[j + 1 : k]) if k > j + 1 else None), k + 1
        return None

    def quantifier(self) -> str:
        ch = self.peek()
        if ch in "*+?":
            self.pos += 1
            text = ch
        else:
            found = self.braces()
            assert found is not None
            low, high, end = found
            if high is not None and high < low:
                raise self.fail("numbers out of order in a {} quantifier")
            self.pos = end
            text = f"{{{low}}}" if high == low else f"{{{low},{'' if high is None else high}}}"
        if self.eat("?"):
            text += "?"
        return text

    def atom(self) -> str:
        ch = self.peek()
        if ch == ".":
            self.pos += 1
            return f"[^{ranges_text([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])}]"
        if ch == "(":
            return self.group()
        if ch == "[":
            return self.char_class()
        if ch == "\\":
            return self.atom_escape()
        if ch in "*+?":
            raise self.fail("nothing to repeat")
        if ch == "{":
            if self.unicode or self.braces() is not None:
                raise self.fail("nothing to repeat" if self.braces() is not None else "lone '{'")
        elif ch in ")]}" and self.unicode:
            raise self.fail(f"lone {ch!r}")
        elif ch == ")":
            raise self.fail("unmatched ')'")
        self.pos += 1
        return char(ord(ch))

    def group(self) -> str:
        self.pos += 1
        marks: list[int | str] = []
        if self.eat("?:"):
            prefix = "(?:"
        elif self.eat("?<"):
            name = self.group_name()
            if name in self.seen_names:
                raise self.fail(f"duplicate group name {name!r}")
            self.seen_names.add(name)
            prefix = f"(?P<{name}>"
            marks = [self.opened + 1, name]
        elif self.peek() == "?":
            raise self.fail("invalid group")
        else:
            prefix = "("
            marks = [self.opened + 1]
        self.opened += bool(marks)
        self.open_groups += marks
        inner = self.disjunction()
        del self.open_groups[len(self.open_groups) - len(marks) :]
        if not self.eat(")"):
            raise self.fail("unterminated group")
        return f"{prefix}{inner})"

    def group_name(self) -> str:
        end = self.source.find(">", self.pos)
        name = self.source[self.pos : end] if end >= 0 else ""
        if not name or not (name[0].isalpha() or name[0] in "$_") or not all(c.isalnum() or c in "$_" for c in name):
            raise self.fail("invalid group name")
        if not name.isascii():  # `regex` takes only ASCII names
            raise self.fail(f"group name {name!r} is not ASCII (supported here only in ASCII)")
        self.pos = end + 1
        return name

    # -- escapes ----------------------------------------------------------------------------------

    def atom_escape(self) -> str:
        self.pos += 1
        ch = self.peek()
        if ch == "":
            raise self.fail("\\ at end of pattern")
        if ch.isdigit() and ch.isascii() and ch != "0":
            return self.backreference()
        if ch == "k" and (self.unicode or self.names):
            self.pos += 1
            if not self.eat("<"):
                raise self.fail("invalid named reference")
            name = self.group_name()
            if name not in self.names:
                raise self.fail(f"no group named {name!r}")
            if name in self.open_groups:  # inside the group it names: not captured yet, the empty string
                return "(?:)"
            return f"(?({name})(?P={name})|)"  # a group that has not matched: the empty string
        found = self.class_escape()
        if found is not None:
            return f"[{found}]"
        return char(self.character_escape(in_class=False))

    def backreference(self) -> str:
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        number = int(self.source[start : self.pos])
        if number <= self.groups:
            if number in self.open_groups:  # inside the group it names: not captured yet, the empty string
                return "(?:)"
            return f"(?({number})\\{number}|)"  # a group that has not matched: the empty string
        if self.unicode:
            raise self.fail(f"reference to group {number}, which does not exist")
        self.pos = start  # Annex B: a legacy octal escape, or the digit itself
        return char(self.legacy_octal())

    def legacy_octal(self) -> int:
        digits = ""
        while len(digits) < 3 and self.peek() in "01234567" and self.peek():
            if digits and int(digits + self.peek(), 8) > 0o377:
                break
            digits += self.peek()
            self.pos += 1
        if not digits:  # \8 and \9 are themselves
            ch = self.peek()
            self.pos += 1
            return ord(ch)
        return int(digits, 8)

    def class_escape(self) -> str | None:
        """The class contents of \\d \\D \\s \\S \\w \\W, or of \\p{..} / \\P{..} with the u flag."""
        ch = self.peek()
        if ch.lower() in CLASS_ESCAPES:
            self.pos += 1
            ranges = CLASS_ESCAPES[ch.lower()]
            return ranges_text(complement(ranges) if ch.isupper() else ranges)
        if ch in "pP" and self.unicode:
            self.pos += 1
            end = self.source.find("}", self.pos)
            body = self.source[self.pos + 1 : end] if self.peek() == "{" and end > 0 else ""
            if not body or not all(c.isalnum() or c in "_=" for c in body) or not body.isascii():
                raise self.fail("invalid property name")
            self.pos = end + 1
            return f"\\{ch}{{{body}}}"
        return None

    def character_escape(self, in_class: bool) -> int:
        """The code point of a CharacterEscape after the backslash (the escape consumed)."""
        ch = self.peek()
        self.pos += 1
        if ch in CONTROL:
            return CONTROL[ch]
        if ch == "c":
            letter = self.peek()
            if letter.isascii() and letter.isalpha():
                self.pos += 1
                return ord(letter) % 32
            if not self.unicode and in_class and (letter.isdigit() or letter == "_") and letter.isascii():
                self.pos += 1
                return ord(letter) % 32
            if self.unicode:
                raise self.fail("invalid \\c escape")
            self.pos -= 1  # Annex B: the backslash itself, then `c`
            return ord("\\")
        if ch == "0" and not (self.peek().isdigit() and self.peek().isascii()):
            return 0
        if ch == "0" or (ch in "1234567" and in_class and not self.unicode):
            if self.unicode:
                raise self.fail("invalid decimal escape")
            self.pos -= 1
            return self.legacy_octal()
        if ch == "x":
            code = self.hex_digits(2)
            if code is not None:
                return code
            if self.unicode:
                raise self.fail("invalid \\x escape")
            return ord("x")
        if ch == "u":
            return self.unicode_escape()
        if self.unicode:
            if ch in SYNTAX or ch == "/" or (ch == "-" and in_class):
                return ord(ch)
            raise self.fail(f"invalid escape \\{ch}")
        if ch == "k" and self.names:
            raise self.fail("invalid named reference")
        if in_class and ch == "b":
            return 0x08
        return ord(ch)

    def hex_digits(self, count: int) -> int | None:
        text = self.source[self.pos : self.pos + count]
        if len(text) == count and all(c in "0123456789abcdefABCDEF" for c in text):
            self.pos += count
            return int(text, 16)
        return None

    def unicode_escape(self) -> int:
        if self.unicode and self.peek() == "{":
            end = self.source.find("}", self.pos)
            digits = self.source[self.pos + 1 : end] if end > 0 else ""
            if not digits or not all(c in "0123456789abcdefABCDEF" for c in digits) or int(digits, 16) > MAX_CODE_POINT:
                raise self.fail("invalid \\u{...} escape")
            self.pos = end + 1
            return int(digits, 16)
        code = self.hex_digits(4)
        if code is None:
            if self.unicode:
                raise self.fail("invalid \\u escape")
            return ord("u")
        if self.unicode and 0xD800 <= code <= 0xDBFF and self.source.startswith("\\u", self.pos):
            mark = self.pos
            self.pos += 2
            low = self.hex_digits(4)
            if low is not None and 0xDC00 <= low <= 0xDFFF:  # a surrogate pair: one code point
                return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
            self.pos = mark
        return code

    # -- classes ----------------------------------------------------------------------------------

    def char_class(self) -> str:
        self.pos += 1
        negated = self.eat("^")
        items: list[str] = []
        while True:
            if self.pos >= len(self.source):
                raise self.fail("unterminated character class")
            if self.eat("]"):
                break
            first = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                second = self.class_atom()
                if isinstance(first, str) or isinstance(second, str):
                    if self.unicode:
                        raise self.fail("a class escape cannot bound a range")
                    items += [first if isinstance(first, str) else char(first), char(ord("-"))]
                    items.append(second if isinstance(second, str) else char(second))
                    continue
                if first > second:
                    raise self.fail("range out of order in character class")
                items.append(f"{char(first)}-{char(second)}")
                continue
            items.append(first if isinstance(first, str) else char(first))
        if not items:
            return f"[{char(0)}-{char(MAX_CODE_POINT)}]" if negated else "(?!)"  # [^] is any character, [] none
        return f"[{'^' if negated else ''}{''.join(items)}]"

    def class_atom(self) -> int | str:
        """A code point, or the class contents of a class escape."""
        ch = self.peek()
        if ch != "\\":
            self.pos += 1
            return ord(ch)
        self.pos += 1
        found = self.class_escape()
        if found is not None:
            return found
        if self.peek() == "b":
            self.pos += 1
            return 0x08
        if self.peek() == "-" and self.unicode:
            self.pos += 1
            return ord("-")
        if self.peek() == "" and not self.unicode:
            raise self.fail("\\ at end of pattern")
        return self.character_escape(in_class=True)


def _count_groups(source: str) -> tuple[int, set[str]]:
    """Capturing groups and group names, counted before parsing (a backreference may come first)."""
    count, names, i, in_class = 0, set(), 0, False
    while i < len(source):
        ch = source[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(" and (
            source[i + 1 : i + 2] != "?" or (source[i + 1 : i + 3] == "?<" and source[i + 3 : i + 4] not in "=!")
        ):
            count += 1
            if source[i + 1 : i + 3] == "?<":
                end = source.find(">", i)
                names.add(source[i + 3 : end] if end > 0 else "")
        i += 1
    return count, names


def translate_strict(source: str) -> str:
    """The `regex` text of a pattern under the u grammar; EcmaSyntaxError when it is not one."""
    groups, names = _count_groups(source)
    return _Parser(source, True, groups, names).pattern()


def translate(source: str) -> str:
    """The `regex` text of a JSON Schema pattern: the u grammar, else Annex B; EcmaSyntaxError (naming
    the u grammar's reason) when neither reads it."""
    try:
        return translate_strict(source)
    except EcmaSyntaxError as strict:
        groups, names = _count_groups(source)
        try:
            return _Parser(source, False, groups, names).pattern()
        except EcmaSyntaxError:
            raise strict from None
