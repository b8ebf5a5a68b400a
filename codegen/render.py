"""Render the compiled schema through the jinja2 templates, format the Python with ruff, and write
or diff the outputs."""

from __future__ import annotations

import difflib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2

from codegen.compile import Compiled
from codegen.load import ROOT, LoadedSchema, SchemaError

TEMPLATES = Path(__file__).resolve().parent / "templates"
OUTPUTS = {
    "engram/_generated/__init__.py": "init.py.j2",
    "engram/_generated/structs.py": "structs.py.j2",
    "engram/_generated/validators.py": "validators.py.j2",
    "engram/_generated/cli.py": "cli.py.j2",
    "docs/config.md": "config.md.j2",
    "engram/_generated/config.md": "config.md.j2",  # `engram docs` prints it from the installed package
}
NO_MODEL = (
    "EngramConfig requires a model with supported Engram embeddings and non-empty n-gram layer ids. "
    "No model config was given."
)


def docstring_text(text: str) -> str:
    """Schema text as the body of a triple-quoted docstring that can only end where the template ends it:
    every backslash and quote escaped, and every character outside printable ASCII as an escape."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if c == "\n" or " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in out)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pyrepr"] = repr
    env.filters["docstring"] = docstring_text
    env.filters["snake"] = lambda name: re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    env.filters["tuple_literal"] = lambda items: repr(tuple(items))
    return env


def render(schema: LoadedSchema, compiled: Compiled) -> dict[str, str]:
    env = environment()
    context: dict[str, Any] = {
        "sha256": schema.sha256,
        "structs": compiled.structs,
        "engram": compiled.engram,
        "sections": compiled.sections,
        "functions": compiled.functions,
        "imports": compiled.imports,
        "attr_rule_functions": list(compiled.attr_rule_functions.values()),
        "rule_structs": list(compiled.attr_rule_functions),
        "field_checks": compiled.field_checks,
        "rules": compiled.rules,
        "flags": compiled.flags,
        "platform": compiled.platform,
        "scope_pointers": {s.name: s.pointer for s in compiled.structs},
        "no_model_message": NO_MODEL,
        "checks": compiled.checks,
    }
    outputs = {}
    for path, template in OUTPUTS.items():
        text = env.get_template(template).render(context)
        outputs[path] = _format_python(compiles(text, path), path) if path.endswith(".py") else text
    # The installed package carries the schema it was generated from (`engram schema` prints it).
    outputs["engram/_generated/engram.schema.json"] = schema.path.read_text()
    return outputs


def compiles(text: str, path: str) -> str:
    """`text`, once Python has compiled it: code that does not compile is the generator's own bug,
    whatever the schema says, and is reported as that (never as a formatter problem)."""
    try:
        compile(text, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise SchemaError(
            f"generator bug: the generated {path} does not compile ({exc}); please report it with the schema"
        ) from None
    return text


def _format_python(text: str, path: str) -> str:
    """ruff (pinned in the dev extras) makes the output formatted and stable across machines."""
    if importlib.util.find_spec("ruff") is None:
        raise SchemaError(
            f"cannot format {path}: ruff is not installed (install the dev extras: pip install -e '.[dev]')"
        )
    cmd = [sys.executable, "-m", "ruff", "format", "--quiet", "--stdin-filename", str(ROOT / path), "-"]
    try:
        done = subprocess.run(cmd, input=text, capture_output=True, text=True, check=False, timeout=60, cwd=ROOT)
    except FileNotFoundError as exc:  # pragma: no cover - the interpreter itself vanished
        raise SchemaError(f"cannot run ruff: {exc}") from None
    if done.returncode != 0:
        raise SchemaError(f"ruff failed on the generated {path}, which compiles; please report it:\n{done.stderr}")
    return done.stdout


def write(outputs: dict[str, str], root: Path = ROOT) -> list[str]:
    changed = []
    for rel, text in outputs.items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(rel)
    return changed


def diff(outputs: dict[str, str], root: Path = ROOT) -> str:
    chunks: list[str] = []
    for rel, text in outputs.items():
        path = root / rel
        old = path.read_text() if path.exists() else ""
        if old != text:
            chunks.extend(difflib.unified_diff(old.splitlines(True), text.splitlines(True), f"a/{rel}", f"b/{rel}"))
    return "".join(chunks)
