"""The `tuned` fixture's type: tests change tuning knobs with it (console/tuning.py).

    def test_x(tuned: Tuned) -> None:
        tuned({"terminal.reattach_s": 1})         # or tuned(terminal={"reattach_s": 1})

The values apply until the test ends, merged over the test settings' own overrides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Tuned = Callable[..., None]


def tuning_env(values: Mapping[str, Any]) -> dict[str, str]:
    """The environment of a console started as a subprocess with these knobs changed."""
    from console.tuning import as_env

    return {"CONSOLE_TUNING": as_env(values)}
