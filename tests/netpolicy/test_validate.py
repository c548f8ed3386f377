"""netpolicy.validate and warnings: every field's bad input with its position, duplicates
however spelled, outbound off, private exceptions, HTTP rules' order, and the warnings for
entries that do nothing or less than they seem to (deny entries win; an allow list means
only those). Pure."""

from __future__ import annotations

import pytest

from netpolicy import Policy, validate, warnings


def test_outbound_off_refuses_lists_and_rules_with_an_explanation() -> None:
    result = validate(
        allow_internet_access=False,
        allow_out=["example.com"],
        deny_out=["10.0.0.0/8"],
        l7_rules=["allow a.com"],
    )
    assert set(result.errors) == {"allow_out", "deny_out", "l7_rules"}
    off = validate(allow_internet_access=False, allow_out=[], deny_out=[], l7_rules=[], allow_private=["10.0.0.0/8"])
    assert "Outbound access is off" in off.errors["allow_private"][0]
    assert all("Outbound access is off" in errors[0] for errors in result.errors.values())


def test_duplicates_are_errors_even_when_spelled_differently() -> None:
    result = validate(
        allow_internet_access=True,
        allow_out=[],
        deny_out=["10.0.0.0/8", "EXAMPLE.com", "example.com."],
        l7_rules=[],
    )
    assert result.errors["deny_out"] == ["entry 3: example.com duplicates entry 2"]


def test_an_allow_entry_under_a_deny_entry_has_no_effect_and_says_so() -> None:
    # Deny entries win: an allow entry a deny entry covers is dead; a deny entry inside an
    # allow entry carves a hole in it (its purpose), no warning.
    result = validate(
        allow_internet_access=True,
        allow_out=["10.1.0.0/16", "api.example.com", "10.0.0.0/8"],
        deny_out=["10.0.0.0/8", "*.example.com"],
        l7_rules=[],
    )
    assert not result.errors
    assert "Allow entry 10.1.0.0/16 has no effect: deny entry 10.0.0.0/8 covers it and deny entries win." in (
        result.warnings
    )
    assert any(w.startswith("Allow entry api.example.com has no effect") for w in result.warnings)
    carve = validate(
        allow_internet_access=True, allow_out=["*.example.com"], deny_out=["admin.example.com"], l7_rules=[]
    )
    assert carve.warnings == []


def test_the_old_deny_all_idiom_warns_that_it_now_refuses_everything() -> None:
    result = validate(allow_internet_access=True, allow_out=["example.com"], deny_out=["0.0.0.0/0"], l7_rules=[])
    assert any("Deny entry 0.0.0.0/0 refuses every IPv4 destination" in w for w in result.warnings)


def test_an_allow_list_alone_needs_no_deny_list() -> None:
    result = validate(allow_internet_access=True, allow_out=["example.com"], deny_out=[], l7_rules=[])
    assert result.warnings == []


def test_a_deny_entry_outside_every_allow_entry_has_no_effect() -> None:
    result = validate(
        allow_internet_access=True, allow_out=["203.0.113.0/24"], deny_out=["198.51.100.0/24"], l7_rules=[]
    )
    assert any("Deny entry 198.51.100.0/24 has no effect" in w for w in result.warnings)
    # A domain deny entry beside CIDR allow entries: the name may resolve inside them.
    mixed = validate(allow_internet_access=True, allow_out=["203.0.113.0/24"], deny_out=["evil.example"], l7_rules=[])
    assert mixed.warnings == []


def test_allow_entries_opening_private_or_link_local_addresses_warn() -> None:
    result = validate(allow_internet_access=True, allow_out=["0.0.0.0/0"], deny_out=[], l7_rules=[])
    assert any("does not open the private addresses inside it" in w for w in result.warnings)
    assert any("link-local, metadata and loopback addresses inside it stay denied" in w for w in result.warnings)
    inside = validate(allow_internet_access=True, allow_out=["10.1.0.0/16"], deny_out=[], l7_rules=[])
    assert inside.warnings == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("8.8.8.0/24", "is not inside a private range"),
        ("169.254.169.254", "holds addresses that are always denied"),
        ("fe80::/64", "holds addresses that are always denied"),
        ("127.0.0.0/8", "holds addresses that are always denied"),
        ("0.0.0.0/0", "holds addresses that are always denied"),
        ("internal.example", "is not a CIDR"),
        ("10.0.0.1/8", "host bits are set"),
    ],
)
def test_private_exceptions_are_private_cidrs_only(entry: str, message: str) -> None:
    result = validate(allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=[], allow_private=[entry])
    assert any(message in e for e in result.errors["allow_private"]), result.errors


def test_private_exceptions_normalise() -> None:
    result = validate(
        allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=[], allow_private=["10.9.8.7", "fd00:1::/32"]
    )
    assert not result.errors
    assert result.texts["allow_private"] == ["10.9.8.7/32", "fd00:1::/32"]
    # fd00::/8 holds a metadata address (fd00:ec2::254): never a private exception.
    metadata = validate(allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=[], allow_private=["fd00::/8"])
    assert "always denied" in metadata.errors["allow_private"][0]


def test_l7_rules_keep_order_and_refuse_repeats() -> None:
    rules: list[object] = [
        "deny api.github.com DELETE /",
        "allow api.github.com GET,POST /repos/",
        "allow *.pypi.org",
        "deny api.github.com DELETE",
    ]
    result = validate(
        allow_internet_access=True,
        allow_out=[],
        deny_out=[],
        l7_rules=rules,
    )
    assert result.errors == {"l7_rules": ["rule 4: repeats the match of rule 1"]}
    assert result.policy is None  # nothing is kept while an error blocks saving
    result = validate(allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=rules[:3])
    assert [r["domain"] for r in result.texts["l7_rules"]] == [
        "api.github.com",
        "api.github.com",
        "*.pypi.org",
    ]
    assert result.texts["l7_rules"][1] == {
        "domain": "api.github.com",
        "methods": ["GET", "POST"],
        "path_prefix": "/repos/",
        "action": "allow",
    }


def test_a_valid_policy_is_returned_typed_and_as_the_text_it_is_stored_as() -> None:
    result = validate(
        allow_internet_access=True,
        allow_out=["PyPI.org", "*.npmjs.org", "203.0.113.7"],
        deny_out=["Evil.npmjs.org."],
        l7_rules=["allow pypi.org GET /simple/"],
        allow_private=["10.20.0.0/16"],
    )
    assert not result.errors
    assert result.policy is not None
    assert result.texts == {
        "allow_internet_access": True,
        "allow_out": ["pypi.org", "*.npmjs.org", "203.0.113.7/32"],
        "deny_out": ["evil.npmjs.org"],
        "allow_private": ["10.20.0.0/16"],
        "l7_rules": [{"domain": "pypi.org", "methods": ["GET"], "path_prefix": "/simple/", "action": "allow"}],
    }
    assert Policy.parse(**result.texts) == result.policy


def test_errors_keep_nothing_and_name_each_position() -> None:
    result = validate(
        allow_internet_access=True, allow_out=["a.test", "bad name", "b_c.test"], deny_out=[], l7_rules=["nope"]
    )
    assert result.policy is None
    assert result.texts["allow_out"] == []
    assert [e.split(":")[0] for e in result.errors["allow_out"]] == ["entry 2", "entry 3"]
    assert result.errors["l7_rules"][0].startswith("rule 1:")


def test_lists_and_rules_have_a_bound() -> None:
    many = [f"h{i}.test" for i in range(501)]
    assert validate(allow_internet_access=True, allow_out=many, deny_out=[], l7_rules=[]).errors == {
        "allow_out": ["at most 500 entries"]
    }
    rules: list[object] = [f"allow h{i}.test" for i in range(201)]
    assert validate(allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=rules).errors == {
        "l7_rules": ["at most 200 rules"]
    }


@pytest.mark.parametrize(
    ("allow_out", "deny_out", "warned"),
    [
        # A plain deny entry covers the allowed subdomain: that allow entry does nothing.
        (["api.example.com"], ["example.com"], "Allow entry api.example.com has no effect"),
        (["*.example.com"], ["example.com"], "Allow entry *.example.com has no effect"),
        # ...but a wildcard deny entry does not cover its parent.
        (["example.com"], ["*.example.com"], None),
        (["10.1.0.0/16"], ["10.0.0.0/8"], "Allow entry 10.1.0.0/16 has no effect"),
        (["example.com"], ["::/0"], "Deny entry ::/0 refuses every IPv6 destination"),
        (["a.test"], ["b.test"], "Deny entry b.test has no effect"),
        (["a.test"], ["x.a.test"], None),  # a hole carved in an allowed name: its purpose
        (["172.0.0.0/8"], [], "does not open the private addresses inside it"),
        (["169.254.0.0/15"], [], "link-local, metadata and loopback addresses inside it stay denied"),
    ],
)
def test_warnings(allow_out: list[str], deny_out: list[str], warned: str | None) -> None:
    policy = Policy.parse(allow_internet_access=True, allow_out=allow_out, deny_out=deny_out)
    found = warnings(policy)
    if warned is None:
        assert found == []
    else:
        assert any(warned in w for w in found), found


def test_a_private_exception_repeating_an_allow_entry_warns() -> None:
    policy = Policy.parse(allow_internet_access=True, allow_out=["10.0.0.0/8"], allow_private=["10.9.0.0/16"])
    assert warnings(policy) == ["Private exception 10.9.0.0/16 repeats an allow entry that covers it already."]
