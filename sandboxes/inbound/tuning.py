"""Inbound traffic's knobs (docs/inbound.md); overrides: CONSOLE_TUNING inbound.*."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class InboundTuning:
    max_request_bytes: int = 100 * 1024 * 1024
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    max_duration_s: float = 3600.0


INBOUND = room("inbound", InboundTuning)
