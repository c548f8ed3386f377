"""A space without its NetworkPolicy row (a legacy space, a row deleted by hand): every page
and every consumer reads the closed policy an unsaved row holds, none writes a row on a GET,
the space's card says the policy was never changed, and the policy page's save makes the row."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from console.models import NetworkPolicy
from sandboxes.catalog.network import network_spec_for, policy_spec
from sandboxes.models import EgressEvent
from tests.factories import make_config, make_space
from tests.personas import World

pytestmark = pytest.mark.django_db


def test_a_space_without_its_policy_row_reads_closed_everywhere_and_saves_it(world: World) -> None:
    space, closed = world.space_a, make_space("Closed reference")
    config = make_config(space)
    EgressEvent.objects.create(
        time=timezone.now(), space=space, sandbox_id="s", layer="dns", destination="a.test", rule="not allowed"
    )
    NetworkPolicy.objects.filter(space=space).delete()
    assert network_spec_for(space) == policy_spec(NetworkPolicy.objects.get(space=closed))
    alice = world.client_for("alice")
    card = alice.get(reverse("console:space_detail", args=[space.id]))
    assert card.status_code == 200
    assert "Outbound: off." in card.content.decode()
    assert "Last changed never." in card.content.decode()
    for page in [
        reverse("console:network_policy_edit", args=[space.id]),
        reverse("sandboxes:config_detail", args=[config.id]),
        reverse("sandboxes:egress_list", args=[space.id]),
        reverse("sandboxes:network_explain", args=[space.id]) + "?destination=a.test",
    ]:
        assert alice.get(page).status_code == 200, page
    assert not NetworkPolicy.objects.filter(space=space).exists()  # no GET wrote a row

    saved = alice.post(
        reverse("console:network_policy_edit", args=[space.id]), {"allow_internet_access": "on", "allow_out": "a.test"}
    )
    assert saved.status_code == 302
    row = NetworkPolicy.objects.get(space=space)
    assert (row.allow_internet_access, row.allow_out) == (True, ["a.test"])
