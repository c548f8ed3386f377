"""Adversarial review of issue 13 (rev3), live through squid: the space's lists against its
HTTP rules on ports 80/443. The lab (tests/sandboxes/backends/docker/egress/test_http_rules.py) serves every
name from a network namespace of its own on a documentation address; nothing leaves the
machine."""

from __future__ import annotations

import time

import pytest

from sandboxes.backends.base import NetworkSpec
from tests.sandboxes.backends.docker.egress.test_http_rules import RULES, Lab, lab  # noqa: F401 - the module's fixture

pytestmark = [pytest.mark.docker]


def _apply(lab: Lab, **lists: tuple[str, ...]) -> None:  # noqa: F811
    network = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=RULES, **lists)
    lab.backend.outbound.update_http_rules(lab.sandbox_id, network)
    time.sleep(1)  # squid's reconfigure (the rule-change test shows < 1 s)


def _restore(lab: Lab) -> None:  # noqa: F811
    _apply(lab)


def test_a_deny_cidr_wins_over_an_http_allow_rule_live(lab: Lab) -> None:  # noqa: F811
    assert lab.http("GET", "web.test", "/public/a").startswith("200 ")  # control: the rule allows it
    try:
        _apply(lab, deny_out=(f"{lab.target.address}/32",))
        assert lab.http("GET", "web.test", "/public/a").startswith("403 ")
    finally:
        _restore(lab)


def test_an_http_allow_rule_does_not_widen_the_allow_list_live(lab: Lab) -> None:  # noqa: F811
    try:
        _apply(lab, allow_out=("other.test",))
        assert lab.http("GET", "other.test", "/").startswith("200 ")  # control: the allow list
        assert lab.http("GET", "web.test", "/public/a").startswith("403 ")
    finally:
        _restore(lab)
