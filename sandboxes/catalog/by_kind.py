"""Forms whose fields depend on a kind of backend (the space's config form, the platform's
backend form): one mechanism for both.

The form shows only the fields the kind takes, read from the adapters' `KindDescription`
(`describe(kind)`), never from a branch on the kind. Until a kind is chosen the form is the
first step: the field that chooses it (`chooser`) alone. Changing the choice re-renders the
form with the new kind's fields before anything is saved: by HTMX on the select's change
(templates/inc/kind_form.html), without JavaScript by the "choose" button or by a post
whose choice differs from the one the fields were shown for (`fields_for`). What was typed
is kept while the fields change, never a typed secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from django import forms
from django.http import HttpRequest

from ..backends.base import KindDescription

FIELDS_FOR = "fields_for"


def choose_button(chooser: str) -> str:
    """The name of the button (and of HTMX's value) that asks for the chosen kind's fields."""
    return f"choose_{chooser}"


class ByKindForm(forms.BaseForm):
    """A form showing only its kind's fields. Subclasses name the field that chooses the kind
    (`chooser`) and, for each field only some kinds take, the `KindDescription` attribute that
    says which (`kind_fields`); `neutral_values` are what a field the kind does not take is
    saved as (None: left as it is)."""

    chooser: ClassVar[str]
    kind_fields: ClassVar[dict[str, str]]
    neutral_values: ClassVar[dict[str, Any]] = {}

    kind: KindDescription | None
    fields_for: str

    def show_kind_fields(self, kind: KindDescription | None, chosen: str) -> None:
        """Keep the fields `kind` takes (the chooser alone without one); `chosen` is the
        chooser's value they are shown for."""
        self.kind, self.fields_for = kind, chosen
        if kind is None:
            for name in list(self.fields):
                if name != self.chooser:
                    del self.fields[name]
            self.left_out: dict[str, Any] = {}
            return
        for name, flag in self.kind_fields.items():
            if name in self.fields and not getattr(kind, flag):
                del self.fields[name]
        self.left_out = {k: v for k, v in self.neutral_values.items() if k not in self.fields}

    @property
    def is_first_step(self) -> bool:
        return self.kind is None

    @property
    def kind_label(self) -> str:
        """The kind's label (templates: `form.kind` would be a field named "kind")."""
        return self.kind.label if self.kind is not None else ""

    @property
    def choose_button(self) -> str:
        return choose_button(self.chooser)

    def kind_data(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The services' data: the fields on the form, and neutral values for the others."""
        data = {k: self.cleaned_data[k] for k in names if k in self.cleaned_data}
        data.update({k: v for k, v in self.left_out.items() if k in names and v is not None})
        return data

    def refused_secrets(self, secrets: tuple[str, ...]) -> list[str]:
        """Secrets posted although the kind's form does not offer them (never dropped silently)."""
        from console.crypto import REDACTED

        return [
            name for name in secrets if name not in self.fields and str(self.data.get(name) or "") not in ("", REDACTED)
        ]


@dataclass(frozen=True)
class KindStep:
    """What a request to a by-kind form asks: to save (the fields posted are the chosen kind's),
    or to show the chosen kind's fields with what was typed kept (`initial`)."""

    save: bool
    initial: dict[str, Any] = field(default_factory=dict)


def kind_step(
    request: HttpRequest, form_class: type[ByKindForm], chosen: str, *, secrets: tuple[str, ...] = ()
) -> KindStep:
    """`chosen`: the chooser's value the fields are for now ("" before one is chosen)."""
    data = request.POST if request.method == "POST" else request.GET
    shown_for = request.POST.get(FIELDS_FOR, "")
    switching = choose_button(form_class.chooser) in request.POST or (
        bool(chosen) and bool(shown_for) and shown_for != chosen
    )
    if request.method == "POST" and chosen and not switching:
        return KindStep(save=True)
    if request.method != "POST" and not request.GET.get(form_class.chooser):
        return KindStep(save=False)
    skip = {"csrfmiddlewaretoken", FIELDS_FOR, choose_button(form_class.chooser), *secrets}
    multiple = {
        name
        for name, f in getattr(form_class, "base_fields", {}).items()
        if isinstance(f, forms.MultipleChoiceField | forms.ModelMultipleChoiceField)
    }
    kept = {k: (data.getlist(k) if k in multiple else data.get(k)) for k in data if k not in skip}
    return KindStep(save=False, initial=kept)
