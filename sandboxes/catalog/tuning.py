"""Catalog knobs; overrides: CONSOLE_TUNING catalog.*."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class CatalogTuning:
    # The disk one Docker template build from Debian packages may use (mmdebstrap runs inside a
    # bounded file system of this size; sandboxes/backends/docker/disk.py).
    template_build_disk_mb: int = 4096
    # The Docker egress logs (refusals, resolvers' query logs, squid's access log) rotate at
    # this size (egress-housekeeping task; one previous generation kept). Passed to the Docker
    # backend with its options, like the bound above.
    egress_log_max_bytes: int = 64 * 1024 * 1024


CATALOG = room("catalog", CatalogTuning)
