"""Egress knobs (docs/network.md); overrides: CONSOLE_TUNING network.*."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class NetworkTuning:
    # How often refusals are read back from the backends, how many are kept per session (their
    # days: retention.egress_events_days), and how long a policy change may spend reaching
    # running sandboxes in the request.
    ingest_interval_s: float = 5.0
    log_max_per_session: int = 1000
    apply_budget_s: float = 4.0


NETWORK = room("network", NetworkTuning)
