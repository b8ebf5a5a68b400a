"""What engram prints: text from a config's keys, a checkpoint's tensor names or a file never reaches the
terminal raw. C0 and C1 controls, DEL, line and paragraph separators and bidirectional overrides are
written as Python escapes (\\x1b, \\n, \\u202e), so such text cannot move the cursor, clear the screen,
reorder what is shown, or start a line of its own that reads like one of engram's."""

from __future__ import annotations

import io
import re
from typing import TextIO

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNPRINTABLE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def size_text(n: int) -> str:
    """A byte count for people: GiB from one GiB up, MiB below."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def printable(text: str) -> str:
    """`text` on one line with every unprintable character escaped (a name, a message)."""
    return _UNPRINTABLE.sub(_escape, text)


class EscapingWriter(io.TextIOBase):
    """A stream that writes to `target` with every unprintable character but newline and tab escaped:
    a command's output keeps its lines, and nothing it quotes can add a control sequence."""

    def __init__(self, target: TextIO) -> None:
        self.target = target

    def write(self, text: str) -> int:
        self.target.write(_UNPRINTABLE_IN_LINES.sub(_escape, text))
        return len(text)

    def flush(self) -> None:
        self.target.flush()
