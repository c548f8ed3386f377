"""Forms whose fields depend on a kind of backend (the space's config form, the platform's
backend form): one mechanism for both.

The kind's fields are generated from the settings its adapter package declares
(`describe(kind)`, a `sandboxes.backends.settings.SettingsSchema`): type, label and unit,
help, secret, bounds; the adapter's own validation and cross-field check run on what was
posted (`clean`). Nothing here asks which kind it is. Until a kind is chosen the form is the
first step: the field that chooses it (`chooser`) alone. Changing the choice re-renders the
form with the new kind's fields before anything is saved: by HTMX on the select's change
(templates/inc/kind_form.html), without JavaScript by the "choose" button or by a post
whose choice differs from the one the fields were shown for (`fields_for`). What was typed
is kept while the fields change, never a typed secret.

Secrets: a stored one shows as ***, posting *** back keeps it (a PEM secret posted empty keeps
it too), a typed one is never rendered back. The model keeps each secret in `<name>_encrypted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from django import forms
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.http import HttpRequest

from console.crypto import REDACTED

from ..backends import all_settings
from ..backends.settings import Given, Scope, Setting, SettingsSchema, SettingType

FIELDS_FOR = "fields_for"


def choose_button(chooser: str) -> str:
    """The name of the button (and of HTMX's value) that asks for the chosen kind's fields."""
    return f"choose_{chooser}"


class SecretInput(forms.PasswordInput):
    """A secret's field: shows *** when one is stored, and never what was typed (a form that
    fails validation would otherwise echo a new key back into the page)."""

    def __init__(self, *, stored: bool = False) -> None:
        super().__init__(attrs={"autocomplete": "new-password"}, render_value=True)
        self.stored = stored

    def get_context(self, name: str, value: Any, attrs: Any) -> dict[str, Any]:
        return super().get_context(name, REDACTED if self.stored else None, attrs)


class SecretTextarea(forms.Textarea):
    """PEM material (TLS client key, certificate, CA): *** when stored, never what was typed."""

    def __init__(self, *, stored: bool = False) -> None:
        super().__init__(attrs={"rows": 3, "spellcheck": "false", "autocomplete": "off"})
        self.stored = stored

    def get_context(self, name: str, value: Any, attrs: Any) -> dict[str, Any]:
        return super().get_context(name, REDACTED if self.stored else None, attrs)


class PemField(forms.CharField):
    """PEM text: *** (or empty) is "" (keep the stored one); else the text, one final newline."""

    def to_python(self, value: Any) -> str:
        text = str(super().to_python(value) or "").strip()
        return "" if not text or text == REDACTED else text + "\n"


def setting_field(setting: Setting, model: type[models.Model], *, stored: bool) -> forms.Field:
    """The Django field of a declared setting (`stored`: a secret of it is stored)."""
    common: dict[str, Any] = {"required": False, "label": setting.label_with_unit, "help_text": setting.help}
    if setting.type == SettingType.PEM:
        return PemField(widget=SecretTextarea(stored=stored), **common)
    if setting.secret:
        return forms.CharField(widget=SecretInput(stored=stored), strip=True, **common)
    if setting.type == SettingType.INT:
        return forms.IntegerField(min_value=setting.minimum, max_value=setting.maximum, **common)
    if setting.type == SettingType.BOOL:
        return forms.BooleanField(**common)
    if setting.type == SettingType.CHOICE:
        return forms.ChoiceField(choices=list(setting.choices), **common)
    return forms.CharField(max_length=_max_length(model, setting.name), strip=True, **common)


def _max_length(model: type[models.Model], name: str) -> int | None:
    try:
        length: int | None = getattr(model._meta.get_field(name), "max_length", None)
    except FieldDoesNotExist:  # not a column of the model: no bound beyond the setting's
        return None
    return length


class ByKindForm(forms.BaseForm):
    """A form showing only its kind's fields. Subclasses name the field that chooses the kind
    (`chooser`) and which admin's settings they show (`scope`); the instance is a model
    instance (`forms.ModelForm`) whose columns are the settings' names."""

    chooser: ClassVar[str]
    scope: ClassVar[Scope]

    kind: SettingsSchema | None
    fields_for: str
    instance: Any  # the ModelForm's row: its columns are the settings' names

    def show_kind_fields(self, kind: SettingsSchema | None, chosen: str) -> None:
        """Generate the fields `kind` declares (the chooser alone without one); `chosen` is
        the chooser's value they are shown for."""
        self.kind, self.fields_for = kind, chosen
        self.left_out: dict[str, Any] = {}
        if kind is None:
            for name in list(self.fields):
                if name != self.chooser:
                    del self.fields[name]
            return
        stored = self.stored_secrets()
        generated = {}
        for setting in kind.of(self.scope):
            generated[setting.name] = setting_field(setting, type(self.instance), stored=setting.name in stored)
            if setting.secret:
                if setting.name in stored:
                    self.initial[setting.name] = REDACTED
            elif not setting.clears:
                self.initial.setdefault(setting.name, getattr(self.instance, setting.name, None))
        names = list(self.fields)
        at = names.index(self.chooser) + 1 if self.chooser in names else len(names)
        order = [*names[:at], *generated, *names[at:]]
        self.fields = {name: generated.get(name) or self.fields[name] for name in order}
        # What a setting of another kind is saved as here (a switch of kind leaves none behind).
        for name, declared in all_settings(self.scope).items():
            empty = declared[0][1].empty
            if name not in self.fields and empty is not None:
                self.left_out[name] = empty

    def stored_secrets(self) -> frozenset[str]:
        """The secrets the instance holds (`<name>_encrypted`)."""
        if self.instance is None or self.instance.pk is None:
            return frozenset()
        return frozenset(name for name in all_settings(self.scope) if getattr(self.instance, f"{name}_encrypted", ""))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.kind is None:
            return cleaned
        for setting in self.kind.of(self.scope):
            unset = cleaned.get(setting.name) is None and setting.name in self.fields
            if setting.type == SettingType.INT and unset and setting.name not in self.errors:
                # Empty keeps the stored value (the model's default on a new row).
                cleaned[setting.name] = getattr(self.instance, setting.name, None)
        cleaned.update(self.kind.normalized(cleaned, self.scope))
        if self.kind.fill is not None and self.scope == Scope.BACKEND:
            filled = self.kind.fill(Given(values=cleaned, stored_secrets=self.stored_secrets()))
            for name, problem in filled.problems.items():
                self.add_error(name if name in self.fields else None, problem)
            if filled.problems:  # what the rest would check is not known yet
                return cleaned
            cleaned.update(filled.values)
        given = Given(values=cleaned, stored_secrets=self.stored_secrets())
        for name, problem in self.kind.problems(given, self.scope).items():
            if name in self.fields and name not in self.errors:
                self.add_error(name, problem)
            elif name not in self.fields:
                self.add_error(None, problem)
        return cleaned

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
        data.update({k: v for k, v in self.left_out.items() if k in names})
        return data

    def secret_values(self) -> dict[str, Any]:
        """The kind's secrets as posted ("" or *** keep a stored one, see the services) and the
        switches that clear stored ones."""
        assert self.kind is not None
        return {
            s.name: self.cleaned_data.get(s.name)
            for s in self.kind.of(self.scope)
            if (s.secret or s.clears) and s.name in self.cleaned_data
        }

    def refused_secrets(self) -> list[str]:
        """Secrets posted although the kind's form does not offer them (never dropped
        silently): each as "<kind> backends take no <label>; nothing was saved."."""
        refused = []
        for name, declared in all_settings(self.scope).items():
            setting = declared[0][1]
            if setting.secret and name not in self.fields and str(self.data.get(name) or "") not in ("", REDACTED):
                refused.append(f"{self.kind_label} backends take no {setting.label}; nothing was saved.")
        return refused


def secret_names(scope: Scope) -> tuple[str, ...]:
    """Every secret any kind declares in `scope` (never kept between the form's steps)."""
    return tuple(name for name, declared in all_settings(scope).items() if any(s.secret for _, s in declared))


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
