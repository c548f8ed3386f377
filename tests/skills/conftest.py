"""The skills tests use the shared personas, and the sandbox tests' Docker fixtures."""

from tests.personas import World, world
from tests.sandboxes.conftest import docker_base_image, test_run_id

__all__ = ["World", "docker_base_image", "test_run_id", "world"]
