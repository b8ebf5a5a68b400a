"""The house by layers: every import of every engram module (at the top of a file or inside a function)
points to its own layer or one below it, as docs/architecture.md draws them, and no modules import each
other in a circle. The order is written once, here."""

from __future__ import annotations

import ast
from pathlib import Path

ENGRAM = Path(__file__).resolve().parents[1] / "engram"

# Bottom up; a module belongs to the first layer one of whose prefixes it starts with.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("engram.errors",)),
    ("terminal and cache", ("engram.terminal", "engram.scratch", "engram.user_cache", "engram.output_files")),
    ("memory", ("engram.memory",)),
    ("ops", ("engram.ops",)),
    ("validation", ("engram.validation",)),
    ("_generated", ("engram._generated",)),
    ("config", ("engram.config",)),
    ("ngram", ("engram.ngram",)),
    # the runtime, floor by floor (docs/architecture.md draws them)
    ("runtime: the shard", ("engram.runtime.shard", "engram.runtime.dist")),
    ("runtime: checkpoints", ("engram.runtime.checkpoints",)),
    ("runtime: placement", ("engram.runtime.placement",)),
    ("runtime: tiers", ("engram.runtime.tiers",)),
    ("runtime: lookup", ("engram.runtime.lookup",)),
    ("runtime: the table", ("engram.runtime.table",)),
    ("runtime: the engine", ("engram.runtime",)),
    ("integrations", ("engram.integrations",)),
    ("apps", ("engram.apps",)),
    ("commands", ("engram.commands", "engram.cli", "engram.__main__")),
]
FACE = "engram"  # the package's own __init__: the names a user needs, re-exported from any layer


def layer_index(module: str) -> int:
    """A module's layer; the package's face sits above them all."""
    return len(LAYERS) if module == FACE else layer_of(module)


def layer_name(module: str) -> str:
    return "face" if module == FACE else LAYERS[layer_of(module)][0]


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGRAM.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ENGRAM.rglob("*.py")}


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS")


def imports_of(module: str) -> set[str]:
    """The engram modules `module` imports: `from X import Y` counts as X.Y where that is a module."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engram"):
            named = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES.keys()
            out |= named or {node.module}
            if len(named) < len(node.names):
                out.add(node.module)  # names that are not modules come from the module itself
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name.startswith("engram")}
    return out - {module}


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in MODULES:
        if module == FACE:
            continue
        try:
            layer_of(module)
        except AssertionError:
            unplaced.append(module)
    assert unplaced == []


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import in `graph` (module -> modules it imports) that points to a higher layer."""
    return sorted(
        f"{module} ({layer_name(module)}) imports {target} ({layer_name(target)})"
        for module, targets in graph.items()
        for target in targets
        if layer_index(target) > layer_index(module)
    )


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk of `graph` meets, as the path that closes it."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


GRAPH = {m: imports_of(m) & MODULES.keys() for m in MODULES}


def test_imports_point_down() -> None:
    assert upward(GRAPH) == []


def test_no_import_circles() -> None:
    assert circles(GRAPH) == []


def test_the_checks_find_an_upward_import_and_a_circle() -> None:
    made_up = {
        "engram.memory.mapping": {"engram.runtime.engine"},
        "engram.runtime.engine": {"engram.runtime.tiers.hot_rows"},
        "engram.runtime.tiers.hot_rows": {"engram.runtime.engine"},
    }
    assert upward(made_up) == [
        "engram.memory.mapping (memory) imports engram.runtime.engine (runtime: the engine)",
        "engram.runtime.tiers.hot_rows (runtime: tiers) imports engram.runtime.engine (runtime: the engine)",
    ]
    assert circles(made_up) == [["engram.runtime.engine", "engram.runtime.tiers.hot_rows", "engram.runtime.engine"]]


# The engine plugins serve their tables through the table layer's public face alone (the table, and the
# opener that makes the config's decisions for it): nothing in them allocates, maps, registers or gathers
# by itself, or decides what the config means for a table (the engine and the plugins share one copy).
TABLE_FACE = ("engram.runtime.table", "engram.runtime.table_opener")
BELOW_THE_FACE = ("engram.memory", "engram.ops", "engram.runtime")


def below_the_face(graph: dict[str, set[str]]) -> list[str]:
    """Every import of an integration that reaches below the table layer's public face."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith("engram.integrations")
        for target in targets
        if target not in TABLE_FACE and any(target == p or target.startswith(p + ".") for p in BELOW_THE_FACE)
    )


def test_integrations_use_only_the_table_layers_face() -> None:
    assert below_the_face(GRAPH) == []
    for face in TABLE_FACE:
        assert any(face in targets for module, targets in GRAPH.items() if module.startswith("engram.integrations"))
    made_up = {"engram.integrations.vllm.qwen": {"engram.ops.library", *TABLE_FACE, "engram.config"}}
    assert below_the_face(made_up) == ["engram.integrations.vllm.qwen imports engram.ops.library"]
