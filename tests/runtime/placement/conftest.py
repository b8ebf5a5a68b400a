"""Fixtures of the placement tests: the small checkpoint for tests of node copies, with a check that none is
left behind (memfds, socket names, /dev/shm files) before and after each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.placement.test_node_sharing import NOTHING, settled


@pytest.fixture
def checkpoint(small_checkpoint: Path) -> Iterator[Path]:
    """The small checkpoint, and a check that the test left nothing of node sharing behind."""
    assert settled() == NOTHING, "a previous test left node copies behind"
    yield small_checkpoint
    assert settled() == NOTHING
