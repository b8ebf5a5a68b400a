"""What hostile schemas cost the schema compiler (codegen.standalone), one child process per case so each
peak of memory is its own: seconds and peak resident memory to compile (and, where it compiles, to
validate one value), against ceilings generous enough to hold on a loaded 2-core machine. Before the
bounds (issue 23) `a{10000000}` took 2.6 GB, 100,000 required names 1.6 GB, a few KB of $dynamicRef
bindings 688 MB, and `(a|a)*$` on a 31-character key more than 10 s. Exits 1 when a case passes its
ceiling. Run: python benchmarks/bench_schema_bounds.py [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _timing import print_table

ROOT = Path(__file__).resolve().parents[1]
SECONDS = 10.0  # per case, compile and validate together
PEAK_MB = 400  # above the child's baseline (the interpreter with torch-free imports)

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from codegen.load import SchemaError
from codegen.standalone import load_validator
schema, value = json.loads(sys.stdin.read())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.perf_counter()
try:
    problems = load_validator(schema)(value)
    outcome = "problems: " + ", ".join(sorted({{p.rule for p in problems}})) if problems else "valid"
except SchemaError as exc:
    outcome = "refused: " + str(exc)[:70]
seconds = time.perf_counter() - began
peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
print(json.dumps({{"outcome": outcome, "seconds": seconds, "peak_mb": peak}}))
"""


def chain(links: int, **beside: object) -> dict[str, object]:
    defs: dict[str, object] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}", **beside} for i in range(links)}
    defs[f"d{links}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


CASES: list[tuple[str, object, object]] = [
    ("pattern a{10000000}", {"pattern": "a{10000000}"}, "a"),
    ("pattern (?:a{65535}){65535}", {"pattern": "(?:a{65535}){65535}"}, "a"),
    ("(a|a)*$ on a 31-character key", {"propertyNames": {"pattern": "(a|a)*$"}}, {"a" * 30 + "b": 1}),
    ("(.*?,){11}P on 26 commas", {"pattern": "(.*?,){11}P"}, "," * 26),
    ("100,000 required names", {"required": [f"n{i}" for i in range(100_000)]}, {"n1": 1}),
    ("enum of 100,000 values", {"enum": list(range(100_000))}, -1),
    ("5,000 pure $ref links", chain(5000), "x"),
    ("201 working $ref links", chain(201, minimum=0), 1),
    ("6,000 working $ref links", chain(6000, minimum=0), 1),
    ("format regex: a{10000000} in data", {"format": "regex", "x-engram-format-assertion": True}, "a{10000000}"),
]


def run(schema: object, value: object) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT))], input=json.dumps([schema, value]),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for name, schema, value in CASES:
        measured = run(schema, value)
        measured["case"] = name
        measured["within"] = measured["seconds"] <= SECONDS and measured["peak_mb"] <= PEAK_MB  # type: ignore[operator]
        results.append(measured)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"hostile schemas, each in its own process (ceilings: {SECONDS:g} s, {PEAK_MB} MB above baseline):")
        print_table(
            ["case", "outcome", "seconds", "peak MB", "within"],
            [
                [
                    str(r["case"]),
                    str(r["outcome"]),
                    f"{r['seconds']:.3f}",
                    f"{r['peak_mb']:.1f}",
                    "yes" if r["within"] else "NO",
                ]
                for r in results
            ],
        )
    return 0 if all(r["within"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
