"""The `engram` command: parse, call, print. Each subcommand lives in engram/commands/."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from engram.commands import COMMANDS
from engram.errors import ConfigError, EngramError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engram",
        description="Engram / PLE n-gram embedding tables for LLM serving: validate, plan, load, look up.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(subparsers)
    return parser


# C0 and C1 controls, DEL, line and paragraph separators and bidirectional overrides: text from a
# config's keys or a file must not move the cursor, clear the screen, reorder what is shown, or start a
# line of its own that reads like one of engram's.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every unprintable character escaped as Python writes it (\\x1b, \\n, \\u202e)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        for problem in exc.errors:
            print(printable(f"error: {problem.path or '/'}: {problem.message} [{problem.rule}]"), file=sys.stderr)
        return 2
    except EngramError as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 2
    except RecursionError:
        print("error: the input nests too deeply to read", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
