"""What other apps add to a space's page, so neither the page nor its template names them:
buttons of the page head (admins only) and cards before the members. Each app registers its
own in its `AppConfig.ready()`; the console imports none of them (skills -> sandboxes ->
console holds for templates too).

An action is a label and the URL it opens for a space; a panel a template and the context
it adds (from the request, the space and whether the user is its admin). Both are shown in
their `order`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from .models import Space


@dataclass(frozen=True)
class SpaceAction:
    label: str
    url: Callable[[Space], str]
    order: int


@dataclass(frozen=True)
class SpacePanel:
    template: str
    context: Callable[[HttpRequest, Space, bool], dict[str, Any]]
    order: int


# Registrations by name, so a repeated ready() replaces rather than repeats (state, not a cache).
_actions: dict[str, SpaceAction] = {}
_panels: dict[str, SpacePanel] = {}


def register_space_action(action: SpaceAction) -> None:
    _actions[action.label] = action


def register_space_panel(panel: SpacePanel) -> None:
    _panels[panel.template] = panel


def space_page_context(request: HttpRequest, space: Space, *, is_admin: bool) -> dict[str, Any]:
    """The registered actions (`space_actions`: label and URL), the panels' templates
    (`space_panels`) and the context the panels add."""
    context: dict[str, Any] = {}
    panels = sorted(_panels.values(), key=lambda panel: panel.order)
    for panel in panels:
        context.update(panel.context(request, space, is_admin))
    actions = sorted(_actions.values(), key=lambda action: action.order)
    return {
        **context,
        "space_actions": [(action.label, action.url(space)) for action in actions],
        "space_panels": [panel.template for panel in panels],
    }
