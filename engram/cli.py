"""The `engram` command: parse, call, print. Each subcommand lives in engram/commands/."""

from __future__ import annotations

import argparse
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        for problem in exc.errors:
            print(f"error: {problem.path or '/'}: {problem.message} [{problem.rule}]", file=sys.stderr)
        return 2
    except EngramError as exc:
        print(f"error: {exc}", file=sys.stderr)
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
