"""Odd disk limits on the config and backend forms: zero, negative, huge, text, a float, a
number past the database's integer: each a form error on the page, nothing saved."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import config_form, make_config
from tests.personas import World

pytestmark = pytest.mark.django_db

ODD = ["0", "-1", "-4096", str(10**12), str(2**31), str(2**63), "lots", "1.5", "1e3", " ", "\x00"]


@pytest.mark.parametrize("value", ODD)
def test_an_odd_config_disk_limit_is_a_form_error(world: World, value: str) -> None:
    config = make_config(world.space_a, name="odd-disk")
    alice = world.client_for("alice")
    before = SandboxConfig.objects.get(pk=config.pk).disk_mb
    answer = alice.post(
        reverse("sandboxes:config_edit", args=[config.pk]),
        config_form(config.backend, name="odd-disk", disk_mb=value),
    )
    assert answer.status_code in (302, 400), answer.status_code
    assert SandboxConfig.objects.get(pk=config.pk).disk_mb == before
    created = alice.post(
        reverse("sandboxes:config_create", args=[world.space_a.pk]),
        config_form(config.backend, name="odd-new", disk_mb=value),
    )
    assert created.status_code in (302, 400), created.status_code
    made = SandboxConfig.objects.filter(name="odd-new").first()
    assert made is None or 64 <= made.disk_mb <= config.backend.max_disk_mb, (value, made and made.disk_mb)


@pytest.mark.parametrize("value", ODD)
def test_an_odd_backend_disk_maximum_is_a_form_error(world: World, value: str) -> None:
    config = make_config(world.space_a, name="odd-backend")
    backend = config.backend
    root = world.client_for("root")
    page = root.get(reverse("sandboxes:backend_edit", args=[backend.pk]))
    assert page.status_code == 200
    form = page.context["form"]
    data: dict[str, Any] = {}
    for name, field in form.fields.items():
        initial = form.initial.get(name, field.initial)
        if initial is None or initial is False:
            continue
        if isinstance(initial, list | tuple):
            data[name] = [str(getattr(v, "pk", v)) for v in initial]
        else:
            data[name] = str(getattr(initial, "pk", initial))
    data["max_disk_mb"] = value
    before = PlatformBackend.objects.get(pk=backend.pk).max_disk_mb
    answer = root.post(reverse("sandboxes:backend_edit", args=[backend.pk]), data)
    assert answer.status_code in (302, 400), answer.status_code
    assert PlatformBackend.objects.get(pk=backend.pk).max_disk_mb == before
