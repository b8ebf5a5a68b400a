"""Tables ready for lookups: the plan (who owns which rows), the table layer (table: one shard's storage
and lookups, over placement/, cache and the checkpoint readers in checkpoints/), and the engine (engine,
embedding, tables, dist, launch, nodes).

EngramTables and init_from_env are imported on first use, so a module of the runtime (dist, say) can be
imported without the whole engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram.runtime.engine import EngramTables, init_from_env

__all__ = ["EngramTables", "init_from_env"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from engram.runtime import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'engram.runtime' has no attribute {name!r}")
