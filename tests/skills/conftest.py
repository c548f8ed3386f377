"""The skills tests use the shared personas, the sandbox tests' Docker fixtures, the
install tests' fixtures (tests/support/skill_install.py)."""

from tests.personas import World, world
from tests.sandboxes.conftest import docker_base_image, test_run_id
from tests.support.skill_install import apt_folder, examples_source, installation, runtime, wheels

__all__ = [
    "World",
    "apt_folder",
    "docker_base_image",
    "examples_source",
    "installation",
    "runtime",
    "test_run_id",
    "wheels",
    "world",
]
