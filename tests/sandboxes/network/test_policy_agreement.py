"""Every consumer of a network policy agrees with its one meaning: the agreement table
(`agreement_table.py`, verdicts written by hand from the semantics) held against `decide`,
explain (the console's function and its API answer), the E2B and Cube translations (what the
adapter sends, read back from the fake control plane), the Docker renderers' output read back
from this host (the nftables ruleset, the space network's dnsmasq configuration, squid's) and,
for a sample, real connections from a Docker sandbox to servers the test starts here.

Each column prints a summary line (cases asked, cases agreeing) and fails listing every
disagreeing case.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import netpolicy
from sandboxes.backends.base import RemoteError, SandboxSpec
from tests.fakes.fixtures import FakeHandle
from tests.sandboxes.network.agreement_table import CASES, PLACEHOLDERS, POLICIES, Case, Tally
from tests.support.agreement import asked, network_spec, reserved
from tests.support.remote_egress import remote_verdict


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Summary lines, written to the terminal when the module ends."""
    lines: list[str] = []
    yield lines
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and lines:
        terminal.write_line("")
        terminal.write_line(f"policy agreement, {len(CASES)} cases over {len(POLICIES)} policies:")
        for line in lines:
            terminal.write_line(f"  {line}")


def settle(tally: Tally, report: list[str]) -> None:
    report.append(tally.line())
    assert not tally.wrong, f"{tally.line()}; disagreeing:\n" + "\n".join(tally.wrong)


def test_the_table_is_large_and_names_every_policy() -> None:
    assert len(CASES) >= 200
    assert {case.policy for case in CASES} == set(POLICIES)
    assert len({case.label for case in CASES}) == len(CASES), "a case is written twice"


def test_decide_agrees(report: list[str]) -> None:
    tally = Tally("decide")
    for case in CASES:
        policy = network_spec(POLICIES[case.policy], PLACEHOLDERS)
        decision = netpolicy.decide(policy, asked(case, PLACEHOLDERS).destination, reserved=reserved(PLACEHOLDERS))
        tally.judge(case, decision.allowed, decision.sentence)
    settle(tally, report)


# --- E2B and Cube: the translation the adapter sends ------------------------------------------


def _remote_column(kind: str, fake: FakeHandle, adapter: Any, test_run_id: str, problems_of: Any) -> Tally:
    tally = Tally(f"{kind} translation")
    bodies: dict[str, dict[str, Any] | str] = {}
    for name, spec in POLICIES.items():
        policy = network_spec(spec, PLACEHOLDERS)
        problems = problems_of(policy, adapter.network_capabilities())
        if problems:
            bodies[name] = f"the console refuses its sessions ({'; '.join(problems)})"
            continue
        try:
            info = adapter.create(SandboxSpec(template_id="base", network=policy, metadata={"test-run": test_run_id}))
        except RemoteError as exc:
            bodies[name] = f"the adapter refuses it ({exc.kind})"
            continue
        try:
            (found,) = [s for s in fake.state()["sandboxes"] if s["sandboxID"] == info.sandbox_id]
            bodies[name] = {"allow_internet_access": found["allow_internet_access"], "network": found["network"]}
        finally:
            adapter.delete(info.sandbox_id)
    for case in CASES:
        body = bodies[case.policy]
        if case.docker_only:
            tally.judge(case, None, "the Docker host's and sandboxes' addresses")
            continue
        if isinstance(body, str):
            tally.judge(case, None, body)
            continue
        destination = asked(case, PLACEHOLDERS).destination
        port = destination.port
        tally.judge(
            case,
            remote_verdict(
                body,
                name=destination.name,
                address=destination.addresses[0],
                web=port is None or destination.web_port is not None,
                http=destination.web_port is not None,
                method=destination.method,
                path=destination.path,
            ),
            f"sent {body['network']}",
        )
    return tally


def _problems(policy: netpolicy.Policy, capabilities: Any) -> list[str]:
    from sandboxes.catalog.network import unsupported_policy_switches

    return list(unsupported_policy_switches(policy, capabilities))  # type: ignore[arg-type]


@pytest.mark.docker
@pytest.mark.e2b
def test_e2b_translation_agrees(report: list[str], fake_e2b_server: FakeHandle, test_run_id: str) -> None:
    from sandboxes.backends.e2b.backend import E2BBackend

    adapter = E2BBackend(fake_e2b_server.backend_config("e2b"))
    try:
        tally = _remote_column("E2B", fake_e2b_server, adapter, test_run_id, _problems)
    finally:
        adapter.close()
    settle(tally, report)


@pytest.mark.docker
@pytest.mark.e2b
def test_cube_translation_agrees(report: list[str], fake_cube_server: FakeHandle, test_run_id: str) -> None:
    from sandboxes.backends.cube.backend import CubeBackend

    adapter = CubeBackend(fake_cube_server.backend_config("cube"))
    try:
        tally = _remote_column("Cube", fake_cube_server, adapter, test_run_id, _problems)
    finally:
        adapter.close()
    settle(tally, report)


def _case(label: str) -> Case:
    return next(c for c in CASES if c.label == label)
