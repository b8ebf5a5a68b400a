"""The `engram` command: parse, call, print. Each subcommand lives in engram/commands/."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from engram.commands import COMMANDS
from engram.errors import ConfigError, EngramError
from engram.terminal import EscapingWriter, printable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engram",
        description="Engram / PLE n-gram embedding tables for LLM serving: validate, plan, load, look up.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with contextlib.redirect_stdout(EscapingWriter(sys.stdout)):
            return int(args.run(args))
    except ConfigError as exc:
        for problem in exc.errors:
            print(printable(f"error: {problem.path or '/'}: {problem.message} [{problem.rule}]"), file=sys.stderr)
        return 2
    except EngramError as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
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
