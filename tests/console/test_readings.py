"""Several reads in one query: `first` rows carry UUIDs as their dashed text on every database."""

from __future__ import annotations

import uuid

import pytest

from console.models import Space
from console.readings import first
from sandboxes.models import Session
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db


def test_a_first_row_gives_ids_and_foreign_keys_dashed_and_other_columns_as_they_are(world: World) -> None:
    config = make_config(world.space_a, name="dashed")
    session = Session.objects.create(space=world.space_a, key="k", config=config)

    row = (
        Space.objects.filter(pk=world.space_a.pk)
        .annotate(
            row=first(
                Session.objects.filter(space=world.space_a),
                id="id",
                space_id="space_id",
                config="config__id",
                key="key",
                version="binding_version",
            )
        )
        .values_list("row", flat=True)
        .get()
    )

    assert row == {
        "id": str(session.id),
        "space_id": str(world.space_a.pk),
        "config": str(config.id),
        "key": "k",
        "version": 0,
    }
    assert str(uuid.UUID(row["id"])) == row["id"]
