"""`python -m codegen` renders the generated code; `--check` exits 1 with a diff when it is stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codegen.check import check_schema
from codegen.compile import compile_schema
from codegen.load import SCHEMA_PATH, SchemaError, load_schema, too_deep
from codegen.render import diff, render, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail with a diff if the committed output is stale")
    parser.add_argument("--schema", type=Path, default=SCHEMA_PATH, help="schema to compile (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        schema = load_schema(args.schema)
        for warning in check_schema(schema.document):
            print(f"codegen: warning: {warning}", file=sys.stderr)
        outputs = render(schema, compile_schema(schema.document))
    except (SchemaError, OSError) as exc:
        print(f"codegen: {exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"codegen: {too_deep()}", file=sys.stderr)
        return 2
    if args.check:
        stale = diff(outputs)
        if stale:
            sys.stdout.write(stale)
            print("codegen: generated code is stale; run `make codegen` and commit the result", file=sys.stderr)
            return 1
        print("codegen: generated code is up to date")
        return 0
    changed = write(outputs)
    print(f"codegen: wrote {', '.join(changed)}" if changed else "codegen: nothing changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
