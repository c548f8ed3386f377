"""The skills tests use the shared personas."""

from tests.personas import World, world

__all__ = ["World", "world"]
