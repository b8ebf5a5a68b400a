"""The argparse action behind --engram-config and --engram-config.<field>: it records every flag in
order so that later flags win and dotted fields win over the JSON object."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


class EngramConfigAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        recorded = list(getattr(namespace, self.dest, None) or [])
        recorded.append((option_string, values))
        setattr(namespace, self.dest, recorded)
