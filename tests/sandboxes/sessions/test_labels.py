"""Session labels (sandboxes/sessions/labels.py): what a label may be, and that a list far
longer than a session may hold is refused after reading no more than one label too many
(the API takes a 2.5 MB body: a checked list must not cost time growing with its square)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.test import Client

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import Session
from sandboxes.sessions.labels import MAX_LABELS, InvalidLabels, has_label, parse_labels
from tests.factories import make_config
from tests.personas import World


class Counted:
    """Distinct valid labels, counting how many were read."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        for number in range(self.total):
            self.read += 1
            yield f"l{number}"


def test_a_list_too_long_is_refused_after_one_label_too_many() -> None:
    many = Counted(200_000)
    with pytest.raises(InvalidLabels) as refused:
        parse_labels(many)
    assert f"At most {MAX_LABELS} labels" in refused.value.message
    assert many.read == MAX_LABELS + 1


def test_text_too_long_is_refused_after_one_label_too_many() -> None:
    with pytest.raises(InvalidLabels) as refused:
        parse_labels(" ".join(f"l{number}" for number in range(200_000)) + " bad<label>")
    assert f"At most {MAX_LABELS} labels" in refused.value.message  # not the bad one at the end


def test_duplicates_do_not_count_and_keep_their_first_order() -> None:
    assert parse_labels(["b", "a", "b"] * 1000) == ["b", "a"]
    assert parse_labels("nightly, team=ml\tnightly\n") == ["nightly", "team=ml"]
    assert parse_labels([f"l{n % MAX_LABELS}" for n in range(10_000)]) == [f"l{n}" for n in range(MAX_LABELS)]


@pytest.mark.parametrize("bad", ["é", "a\x00b", "a b", "a%", "_a", "a" * 64, "nightly\n\n" + "x\u200b"])
def test_odd_labels_are_refused(bad: str) -> None:
    with pytest.raises(InvalidLabels):
        parse_labels([bad])


def test_a_filter_on_an_odd_label_matches_nothing() -> None:
    assert str(has_label("a%")) == str(has_label("_"))  # both the empty filter


@pytest.mark.django_db
def test_the_api_refuses_a_huge_label_list_with_a_clear_error(world: World) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    answer = Client().post(
        f"/api/v1/spaces/{world.space_a.id}/sessions/many-labels/resolve",
        json.dumps({"labels": [f"l{number}" for number in range(150_000)]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 400
    assert f"At most {MAX_LABELS} labels" in answer.json()["error"]["message"]
    assert not Session.objects.filter(key="many-labels").exists()
