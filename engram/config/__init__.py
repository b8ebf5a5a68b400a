"""The Engram configuration: one validated EngramConfig (and the deployment around it) from a dict, JSON
text or bytes, a file, the environment and the command line; ConfigError lists every problem. The names
are loading's (its __all__)."""

from engram.config import loading
from engram.config.loading import *  # noqa: F403

__all__ = loading.__all__
