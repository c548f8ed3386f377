"""The "Verify backend" admin job: a checklist run against a config's backend.

Every check goes through the neutral contract only (no backend kind is ever named), so the
same checklist verifies Docker, E2B and Cube. Each check ends as `pass`, `fail` or
`unsupported` (the backend lacks the capability, with the reason), with details and its
duration; the list is stored in `job.result["checks"]`. Everything the run creates (sandboxes
and snapshots) is deleted at the end, whatever happened; a cleanup failure is reported.

Checks:

1. `snapshot_as_template`: a snapshot id works as a template id, and snapshots are kept out
   of the template list;
2. `snapshot_keeps_source`: snapshotting a running sandbox leaves it running and usable;
3. `pause_resume`: pause then connect keeps files and memory (a background process
   survives), and paused sandboxes are listed;
4. `metadata_lists_back`: metadata set at create lists back by space and by session;
5. `outbound_off`: a sandbox created with outbound off has no way out (no default route, or
   its gateway cannot be reached); nothing is sent off the machine;
6. `data_plane_contract`: commands run as uid 1000 (root only on request), binary uploads
   round-trip with their mode and owner;
7. `data_plane_agent`: the backend's health answers and the template's agent runs commands;
8. `paging_delete_echo`: paging with a page size of one, idempotent delete, metadata echo.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from console.jobs import JobContext, JobFailed, job_handler

from ..backends.base import (
    META_SESSION,
    META_SPACE,
    Backend,
    ErrorKind,
    ExecRequest,
    ExecResult,
    ListQuery,
    NetworkSpec,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
    is_snapshot_id,
)
from ..models import SandboxConfig
from .bridge import console_metadata, get_backend
from .network import network_spec_for, policy_refusal, unsupported_policy_switches

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
OUTBOUND_OFF = NetworkSpec(allow_internet_access=False, allow_public_traffic=False)
VERIFY_TTL_S = 900

# Prints "none" when there is no default route, else the IPv4 gateway (or "v6" when only
# IPv6 routes out). /proc is read so no tool (ip, route) is needed in the template.
_ROUTE_PROBE = r"""
gw=$(awk 'NR > 1 && $2 == "00000000" { print $3; exit }' /proc/net/route 2>/dev/null)
if [ -n "$gw" ]; then
  printf '%d.%d.%d.%d\n' 0x${gw#??????} 0x$(echo $gw | cut -c5-6) 0x$(echo $gw | cut -c3-4) 0x$(echo $gw | cut -c1-2)
elif awk '$1 == "00000000000000000000000000000000" && $2 == "00" && $10 != "lo" { f=1 } END { exit !f }' \
    /proc/net/ipv6_route 2>/dev/null; then
  echo v6
else
  echo none
fi
"""
# Tries the gateway (a local address: nothing leaves the machine): "reachable" when a TCP
# connection succeeds or is refused (a refusal is an answer), else "blocked".
_GATEWAY_PROBE = (
    'out=$(timeout 3 bash -c "exec 3<>/dev/tcp/$0/53" 2>&1); rc=$?; '
    'if [ $rc -eq 0 ] || echo "$out" | grep -qi refused; then echo reachable; else echo blocked; fi'
)


@dataclass
class Check:
    name: str
    title: str
    status: str = PASS
    detail: str = ""
    ms: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "detail": self.detail, "ms": self.ms}


class CheckFailed(Exception):
    """A check's own failure (the backend answered, but not as the contract says)."""


class Unsupported(Exception):
    """The backend lacks what the check needs; the message says what."""


@dataclass
class Verifier:
    """Runs the checklist on one backend; remembers what it made so it can clean up."""

    backend: Backend
    template_id: str
    metadata: Mapping[str, str]
    report: Callable[[Check], None] = lambda check: None
    sandboxes: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    cleanup_errors: list[str] = field(default_factory=list)

    # Helpers ---------------------------------------------------------------------------

    def create(self, **metadata: str) -> SandboxInfo:
        spec = SandboxSpec(
            template_id=self.template_id,
            network=OUTBOUND_OFF,
            metadata={**self.metadata, **metadata},
            timeout_s=VERIFY_TTL_S,
        )
        info = self.backend.create(spec)
        self.sandboxes.append(info.sandbox_id)
        return info

    def sh(self, sandbox_id: str, line: str, **options: Any) -> ExecResult:
        return self.backend.exec(sandbox_id, ExecRequest(shell=line, timeout_s=60, **options))

    def out(self, sandbox_id: str, line: str, **options: Any) -> str:
        result = self.sh(sandbox_id, line, **options)
        if result.exit_code != 0:
            raise CheckFailed(f"`{line.strip()[:60]}` exited {result.exit_code}: {result.stderr[-300:]!r}")
        return result.stdout.decode(errors="replace").strip()

    @staticmethod
    def expect(condition: bool, message: str) -> None:
        if not condition:
            raise CheckFailed(message)

    @contextmanager
    def check(self, checks: list[Check], name: str, title: str) -> Iterator[Check]:
        item = Check(name=name, title=title)
        started = time.monotonic()
        try:
            yield item
        except Unsupported as exc:
            item.status, item.detail = UNSUPPORTED, str(exc)
        except CheckFailed as exc:
            item.status, item.detail = FAIL, str(exc)
        except RemoteError as exc:
            item.status, item.detail = FAIL, f"{exc.kind}: {exc.message}"
        item.ms = round((time.monotonic() - started) * 1000, 1)
        checks.append(item)
        self.report(item)

    # The checklist ---------------------------------------------------------------------

    def run(self) -> list[Check]:
        checks: list[Check] = []
        try:
            self._run(checks)
        finally:
            self.cleanup()
        return checks

    def _run(self, checks: list[Check]) -> None:
        source: SandboxInfo | None = None
        snapshot_id: str | None = None
        with self.check(checks, "snapshot_as_template", "A snapshot id works as a template; templates exclude it") as c:
            snapshots = self.backend.snapshots()
            if snapshots is None:
                raise Unsupported(f"{self.backend.label} offers no snapshots with this config")
            source = self.create()
            marker = uuid.uuid4().hex
            self.out(source.sandbox_id, f'echo {marker} > "$HOME/.verify-marker"')
            snapshot = snapshots.create(source.sandbox_id, name="console-verify")
            snapshot_id = snapshot.snapshot_id
            self.snapshots.append(snapshot_id)
            self.expect(is_snapshot_id(snapshot_id), f"snapshot id {snapshot_id!r} is not shown as snap-…")
            child = self._create_from(snapshot_id)
            seen = self.out(child.sandbox_id, 'cat "$HOME/.verify-marker"')
            self.expect(seen == marker, f"the sandbox made from the snapshot reads {seen!r}, not the marker")
            templates = self.backend.templates()
            if templates is None:
                c.detail = f"{snapshot_id} seeded a sandbox; this backend lists no templates"
            else:
                listed = [t.template_id for t in templates.list()]
                leaked = [t for t in listed if is_snapshot_id(t) or t == snapshot_id]
                self.expect(not leaked, f"snapshots in the template list: {leaked}")
                c.detail = f"{snapshot_id} seeded a sandbox; {len(listed)} templates listed, no snapshot among them"

        with self.check(checks, "snapshot_keeps_source", "Snapshotting leaves the source running and usable") as c:
            if source is None or snapshot_id is None:
                raise Unsupported("no snapshot was made (see the previous check)")
            state = self.backend.get(source.sandbox_id).state
            self.expect(state == SandboxState.RUNNING, f"the source is {state} after the snapshot")
            self.expect(self.out(source.sandbox_id, "echo still-here") == "still-here", "the source does not answer")
            c.detail = "source running and answering after the snapshot"

        with self.check(checks, "pause_resume", "Pause then connect keeps files and processes; paused are listed") as c:
            info = self.create(**{META_SESSION: f"verify-pause-{uuid.uuid4().hex[:8]}"})
            self.out(info.sandbox_id, "echo kept > /tmp/verify-kept")
            self.out(info.sandbox_id, "setsid nohup sleep 4242 > /dev/null 2>&1 < /dev/null & echo started")
            pid = self.out(info.sandbox_id, "pgrep -xf 'sleep 4242' | head -1")
            paused = self.backend.pause(info.sandbox_id)
            idle_states = frozenset({SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.STOPPED})
            self.expect(paused.state in idle_states, f"pause left the sandbox {paused.state}")
            idle_page = self.backend.list(ListQuery(metadata=dict(info.metadata), states=idle_states))
            self.expect(
                info.sandbox_id in [item.sandbox_id for item in idle_page.items], "the paused sandbox is not listed"
            )
            resumed = self.backend.connect(info.sandbox_id)
            self.expect(resumed.state == SandboxState.RUNNING, f"connect left the sandbox {resumed.state}")
            self.expect(self.out(resumed.sandbox_id, "cat /tmp/verify-kept") == "kept", "a file was lost")
            if paused.state == SandboxState.STOPPED:
                raise Unsupported("files kept; this config idles by stopping, so processes are not kept by design")
            alive = self.sh(resumed.sandbox_id, f"kill -0 {pid}")
            self.expect(alive.exit_code == 0, f"the background process {pid} did not survive")
            c.detail = f"file and background process {pid} kept across pause ({paused.state}) and connect"

        with self.check(checks, "metadata_lists_back", "Metadata set at create lists back by space and session") as c:
            session = f"verify-meta-{uuid.uuid4().hex[:8]}"
            info = self.create(**{META_SESSION: session})
            space = info.metadata.get(META_SPACE) or self.metadata.get(META_SPACE)
            by_session = self.backend.list(ListQuery(metadata={META_SESSION: session}))
            self.expect([i.sandbox_id for i in by_session.items] == [info.sandbox_id], "listing by session missed it")
            if space:
                in_space = {i.sandbox_id for i in self.backend.iter_sandboxes(ListQuery(metadata={META_SPACE: space}))}
                self.expect(info.sandbox_id in in_space, "listing by space missed it")
            echoed = self.backend.get(info.sandbox_id).metadata
            missing = {k: v for k, v in {**self.metadata, META_SESSION: session}.items() if echoed.get(k) != v}
            self.expect(not missing, f"metadata not echoed: {missing}")
            c.detail = f"found by session{' and by space' if space else ''}; {len(echoed)} keys echoed"

        probe: SandboxInfo | None = None
        with self.check(checks, "outbound_off", "With outbound off the sandbox has no way out") as c:
            if not self.backend.network_capabilities().outbound_toggle:
                raise Unsupported(f"{self.backend.label} has no outbound switch")
            probe = self.create(**{META_SESSION: f"verify-net-{uuid.uuid4().hex[:8]}"})
            route = self.out(probe.sandbox_id, _ROUTE_PROBE)
            if route == "none":
                c.detail = "no default route (no interface but loopback routes out)"
            elif route == "v6":
                raise CheckFailed("an IPv6 default route exists with outbound off")
            else:
                answer = self.out(probe.sandbox_id, _GATEWAY_PROBE + f" {route}")
                self.expect(answer == "blocked", f"the gateway {route} answers with outbound off")
                c.detail = f"default route via {route}, but the gateway cannot be reached"

        with self.check(checks, "data_plane_contract", "Commands run as uid 1000; uploads keep bytes and mode") as c:
            target = probe or self.create()
            self.expect(self.out(target.sandbox_id, "id -u") == "1000", "commands do not run as uid 1000")
            self.expect(self.out(target.sandbox_id, "id -u", user="root") == "0", "root on request does not work")
            files = self.backend.files()
            if files is None:
                raise Unsupported("uid 1000 confirmed; this backend has no file transfer")
            payload = bytes(range(256)) * 16
            path = f"/tmp/verify-{uuid.uuid4().hex[:8]}.bin"  # noqa: S108 - inside the sandbox
            files.write(target.sandbox_id, path, payload, mode=0o750)
            self.expect(files.read(target.sandbox_id, path) == payload, "the upload did not round-trip byte for byte")
            stat = files.stat(target.sandbox_id, path)
            self.expect(stat.mode & 0o777 == 0o750, f"mode {oct(stat.mode)} instead of 0o750")
            owner = self.out(target.sandbox_id, f"stat -c %u {path}")
            self.expect(owner == "1000", f"the upload is owned by uid {owner}")
            c.detail = "uid 1000 by default, root on request; 4 KiB binary upload kept bytes, mode 0750, owner 1000"

        with self.check(checks, "data_plane_agent", "The template's agent answers") as c:
            health = self.backend.health()
            self.expect(health.ok, f"health: {health.detail}")
            target = probe or self.create()
            started = time.monotonic()
            self.expect(self.out(target.sandbox_id, "echo ready") == "ready", "no answer from the sandbox agent")
            c.detail = f"{health.version}; a command answered in {(time.monotonic() - started) * 1000:.0f} ms"

        with self.check(checks, "paging_delete_echo", "Paging, idempotent delete, metadata echo") as c:
            group = {META_SESSION: f"verify-page-{uuid.uuid4().hex[:8]}"}
            made = {self.create(**group).sandbox_id for _ in range(3)}
            first = self.backend.list(ListQuery(metadata=group, limit=1))
            self.expect(len(first.items) == 1 and bool(first.next_token), "a page of one did not offer a next page")
            walked = list(self.backend.iter_sandboxes(ListQuery(metadata=group, limit=1)))
            ids = [i.sandbox_id for i in walked]
            self.expect(sorted(ids) == sorted(made), f"paging returned {len(ids)} items for {len(made)} sandboxes")
            self.expect(all(i.metadata.get(META_SESSION) == group[META_SESSION] for i in walked), "metadata not echoed")
            victim = ids[0]
            self.backend.delete(victim)
            self.backend.delete(victim)
            try:
                self.backend.get(victim)
            except RemoteError as exc:
                self.expect(exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.GONE), f"get after delete: {exc.kind}")
            else:
                raise CheckFailed("the deleted sandbox is still there")
            c.detail = "3 sandboxes in 3 pages of one, no repeats; delete twice succeeded"

    def _create_from(self, template_id: str) -> SandboxInfo:
        spec = SandboxSpec(
            template_id=template_id,
            network=OUTBOUND_OFF,
            metadata={**self.metadata, META_SESSION: f"verify-snap-{uuid.uuid4().hex[:8]}"},
            timeout_s=VERIFY_TTL_S,
        )
        info = self.backend.create(spec)
        self.sandboxes.append(info.sandbox_id)
        return info

    def cleanup(self) -> None:
        for sandbox_id in self.sandboxes:
            try:
                self.backend.delete(sandbox_id)
            except RemoteError as exc:
                self.cleanup_errors.append(f"sandbox {sandbox_id}: {exc.kind}: {exc.message}")
        capability = self.backend.snapshots()
        for snapshot_id in self.snapshots:
            if capability is None:
                break
            try:
                capability.delete(snapshot_id)
            except RemoteError as exc:
                self.cleanup_errors.append(f"snapshot {snapshot_id}: {exc.kind}: {exc.message}")


def policy_check(config: SandboxConfig, backend: Backend) -> Check:
    """Whether this backend can enforce the space's current network policy (else its sessions get 409)."""
    item = Check(name="network_policy", title="The space's network policy can be enforced on this backend")
    problems = unsupported_policy_switches(network_spec_for(config.space), backend.network_capabilities())
    if problems:
        item.status, item.detail = FAIL, policy_refusal(config.name, backend.label, problems)
    else:
        item.detail = "every switch of the policy is honoured"
    return item


def summary(checks: list[Check]) -> dict[str, int]:
    counts = {PASS: 0, FAIL: 0, UNSUPPORTED: 0}
    for check in checks:
        counts[check.status] += 1
    return counts


# ---------------------------------------------------------------------------------------
# The job and its start view


@job_handler("sandboxes.verify_backend", label="Verify backend")
def verify_backend_job(ctx: JobContext) -> dict[str, Any]:
    """Run the checklist; the job succeeds when it ran, and its result says what failed."""
    try:
        config = SandboxConfig.objects.select_related("space").get(pk=ctx.params["config_id"])
    except SandboxConfig.DoesNotExist:
        raise JobFailed("the sandbox config was deleted") from None
    ctx.log(f"Verifying {config.name} ({config.get_kind_display()}) with template {config.default_template}")
    done: list[Check] = []

    def report(check: Check) -> None:
        done.append(check)
        ctx.progress(
            min(95, 12 * len(done)), f"{check.title}: {check.status.upper()} ({check.ms:.0f} ms) {check.detail}"
        )

    run_id = uuid.uuid4().hex[:8]
    metadata = console_metadata(config, **{META_SESSION: f"verify-{run_id}"})
    try:
        backend = get_backend(config)
        verifier = Verifier(backend, config.default_template, metadata, report)
        checks = verifier.run()
        checks.append(policy_check(config, backend))
        report(checks[-1])
    except RemoteError as exc:
        raise JobFailed(f"{exc.kind}: {exc.message}") from exc
    counts = summary(checks)
    for problem in verifier.cleanup_errors:
        ctx.log(f"Cleanup: {problem}")
    ctx.log(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[UNSUPPORTED]} unsupported.")
    return {
        "checks": [check.as_json() for check in checks],
        "summary": counts,
        "ok": counts[FAIL] == 0 and not verifier.cleanup_errors,
        "cleanup_errors": verifier.cleanup_errors,
    }
