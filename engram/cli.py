"""The `engram` command: parse, call, print. Each subcommand lives in engram/commands/."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence

from engram.commands import COMMANDS
from engram.errors import EngramError
from engram.terminal import EscapingWriter, printable


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: `command`'s in full (its module imported), the others by name and
    summary alone (their modules, and what they import, are not)."""
    parser = argparse.ArgumentParser(
        prog="engram",
        description="Engram / PLE n-gram embedding tables for LLM serving: validate, plan, load, look up.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = set() if command is None else {COMMANDS[command][0]}
    for module in dict.fromkeys(module for module, _ in COMMANDS.values()):
        if module in wanted:
            importlib.import_module(f"engram.commands.{module}").register(subparsers)
    for name, (module, summary) in COMMANDS.items():
        if module not in wanted:
            subparsers.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): Python leaves None in its place
        if sys.stderr is not None:
            print(
                "error: standard output is closed; give the command somewhere to write (a file, a pipe)",
                file=sys.stderr,
            )
        return 2
    named = next((a for a in arguments if not a.startswith("-")), None)
    parser = build_parser(named if named in COMMANDS else None)
    args = parser.parse_args(arguments)
    try:
        with contextlib.redirect_stdout(EscapingWriter(sys.stdout)):
            return int(args.run(args))
    except EngramError as exc:
        for line in exc.lines():
            print(printable(f"error: {line}"), file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path the user gave that the system refused: named, never a traceback
        where = f"{str(exc.filename)[:300]}: " if exc.filename is not None else ""
        print(printable(f"error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 2
    except RecursionError:
        print("error: the input nests too deeply to read", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
