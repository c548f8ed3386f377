"""The console tests use the shared personas; the tests of the console as real processes
(test_ops_processes.py) use the sandbox tests' Docker fixtures (tests/sandboxes/conftest.py)."""

from tests.personas import World, world
from tests.sandboxes.conftest import docker_base_image, engine, test_run_id

__all__ = ["World", "docker_base_image", "engine", "test_run_id", "world"]
