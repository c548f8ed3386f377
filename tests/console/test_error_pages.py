"""Error pages render in the layout with their reason; an expected 403 logs one line."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.test import Client, override_settings
from django.urls import include, path, reverse

pytestmark = pytest.mark.django_db


def _raise_crash(request):  # a view that fails as a bug would
    raise RuntimeError("secret detail that must not show")


def _raise_suspicious(request):
    from django.core.exceptions import SuspiciousOperation

    raise SuspiciousOperation("attacker <script> input")


urlpatterns = [
    path("crash/", _raise_crash),
    path("suspicious/", _raise_suspicious),
    path("", include("console.urls")),  # the layout's links
]
# The console's handlers, as the root URLconf names them (checked below).
handler400 = "console.errors.bad_request"
handler500 = "console.errors.server_error"


def test_403_in_layout_names_the_role(world, caplog):
    client = world.client_for("bob")  # a member of A, not an admin
    url = reverse("console:space_edit", kwargs={"space_id": world.space_a.id})
    with caplog.at_level(logging.INFO, logger="django.request"):
        response = client.get(url)
    assert response.status_code == 403
    body = response.content.decode()
    assert 'class="topbar"' in body
    assert 'aria-label="Main"' in body
    assert "This needs the admin role in Space A." in body
    records = [r for r in caplog.records if r.name == "django.request"]
    assert len(records) == 1, [r.getMessage() for r in records]
    record = records[0]
    assert record.exc_info is None
    assert not record.exc_text
    assert "admin role" in record.getMessage()
    assert "\n" not in record.getMessage()


def test_404_in_layout_same_for_outsider_and_missing(world):
    client = world.client_for("charlie")  # admin of B, outsider to A
    outsider = client.get(reverse("console:space_detail", kwargs={"space_id": world.space_a.id}))
    missing = client.get(reverse("console:space_detail", kwargs={"space_id": uuid.uuid4()}))
    assert outsider.status_code == missing.status_code == 404
    for response in (outsider, missing):
        body = response.content.decode()
        assert 'class="topbar"' in body
        assert "Not found" in body
        assert "No such space" in body


def test_404_for_unknown_url_shows_no_patterns(world):
    response = world.client_for("alice").get("/no/such/page/")
    assert response.status_code == 404
    body = response.content.decode()
    assert "Not found" in body
    assert "There is nothing at this address" in body
    assert "tried" not in body
    assert "urlpatterns" not in body


@override_settings(ROOT_URLCONF=__name__)
def test_500_in_layout_without_details(db):
    client = Client(raise_request_exception=False)
    response = client.get("/crash/")
    assert response.status_code == 500
    body = response.content.decode()
    assert "Something went wrong" in body
    assert 'class="topbar"' in body
    assert "secret detail" not in body


@override_settings(ROOT_URLCONF=__name__)
def test_400_in_layout_without_echoing_input(db):
    from console import urls as root_urls

    assert (root_urls.handler400, root_urls.handler500) == (handler400, handler500)
    response = Client(raise_request_exception=False).get("/suspicious/")
    assert response.status_code == 400
    body = response.content.decode()
    assert "Bad request" in body
    assert 'class="topbar"' in body
    assert "attacker" not in body


def test_a_csrf_failure_is_a_page_in_the_layout(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.alice)
    response = client.post(reverse("console:space_edit", kwargs={"space_id": world.space_a.id}), {"name": "x"})
    assert response.status_code == 403
    body = response.content.decode()
    assert 'class="topbar"' in body
    assert "security token did not match" in body
