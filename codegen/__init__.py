"""The engram code generator: load -> check -> compile -> render (schema to structs, validators, CLI, docs)."""
