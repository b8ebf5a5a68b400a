"""Subcommands of `engram`. Each module has register(subparsers), which sets `run` on its parser."""

from engram.commands import checkpoint, demo, doctor, ngram, plan, profile, schema_docs, validate

COMMANDS = (validate, schema_docs, ngram, checkpoint, plan, doctor, demo, profile)
