"""Sandbox lifecycle of the fake: create, kill, pause, resume, snapshot, TTL expiry.

Every transition really happens to the backing container: pause is ``docker pause`` (the
processes stop), resume is ``docker unpause``, snapshot is ``docker commit``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
import threading
import time
from typing import Any

from tests.fakes.fake_http import HttpError
from tests.fakes.fake_runtime import RuntimeFailure
from tests.fakes.fake_state import FakeSandbox, Store, Template, new_id, now
from tests.fakes.fake_volumes import Volumes


class Lifecycle:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.runtime = store.runtime
        self.volumes = Volumes(store)

    # -- create -------------------------------------------------------------------------------

    def create(self, body: dict[str, Any], default_timeout: int, image: str | None = None) -> FakeSandbox:
        """A new sandbox from body["templateID"]; ``image`` overrides the template's image
        (fork: the origin's committed state)."""
        template_ref = body.get("templateID")
        if not isinstance(template_ref, str) or not template_ref:
            raise HttpError(400, "templateID is required")
        template = self.store.resolve_template(template_ref)
        if template is None or template.status not in ("ready", "READY"):
            raise HttpError(404, f"template '{template_ref}' not found")
        timeout = int(body.get("timeout", default_timeout))
        if timeout < 0:
            raise HttpError(400, "timeout must be >= 0")
        metadata = dict(body.get("metadata") or {})
        annotations: dict[str, str] = {}
        if self.store.is_cube and "host-mount" in metadata:
            # Cube lifts `host-mount` out of the labels into an annotation (CubeAPI create
            # mapping); it never comes back as user metadata.
            annotations["host-mount"] = metadata.pop("host-mount")
        env_vars = {str(k): str(v) for k, v in (body.get("envVars") or {}).items()}
        auto_pause, auto_resume = body.get("_idle") or (
            bool(body.get("autoPause", False)),
            bool((body.get("autoResume") or {}).get("enabled", False)),
        )
        mounts = self.volumes.mounts_for(body, annotations)
        sandbox_id = new_id()
        image = image or template.image
        try:
            container_id = self.runtime.create(sandbox_id, image, env_vars, mounts)
        except RuntimeFailure as e:
            # E.g. a host-mount of a missing directory: Cubelet's bind mount fails, and
            # CubeAPI answers a failed create with 500.
            raise HttpError(e.status, str(e)) from e
        started = now()
        sbx = FakeSandbox(
            sandbox_id=sandbox_id,
            template_id=template.template_id,
            alias=template.names[0] if template.names else None,
            image=image,
            container_id=container_id,
            envd_version=self.store.envd_version,
            metadata=metadata,
            env_vars=env_vars,
            timeout=timeout,
            started_at=started,
            end_at=started + dt.timedelta(seconds=timeout),
            # How this server read the idle behaviour and the egress switch (fake_control _idle,
            # _egress); a fork copies its origin's.
            auto_pause=auto_pause,
            auto_resume=auto_resume,
            egress=bool(body.get("_egress", True)),
            inbound=bool(body.get("_inbound", True)),
            l7_rules=list(body.get("_l7_rules") or []),
            auto_pause_memory=bool(body.get("autoPauseMemory", True)),
            allow_internet_access=body.get("allow_internet_access"),
            network=body.get("network"),
            annotations=annotations,
            mounts=mounts,
            volume_mounts=[] if self.store.is_cube else list(body.get("volumeMounts") or []),
        )
        self._issue_tokens(sbx, body)
        template.spawn_count += 1
        with self.store.lock:
            self.store.sandboxes[sandbox_id] = sbx
        return sbx

    def _issue_tokens(self, sbx: FakeSandbox, body: dict[str, Any]) -> None:
        network = body.get("network") or {}
        if self.store.is_cube:
            # Cube before v0.5.0: both tokens null (nothing gates the public URL). From v0.5.0
            # a traffic token when allowPublicTraffic is false (CubeMaster id2ip.go), only in
            # this response.
            if self.store.cube_has("inbound_gate") and network.get("allowPublicTraffic") is False:
                sbx.traffic_access_token = secrets.token_hex(16)
            return
        if body.get("secure"):
            sbx.envd_access_token = secrets.token_hex(16)
        if network.get("allowPublicTraffic") is False:
            sbx.traffic_access_token = secrets.token_hex(16)

    # -- kill / pause / resume ----------------------------------------------------------------

    def kill(self, sbx: FakeSandbox) -> None:
        with self.store.lock:
            self.store.sandboxes.pop(sbx.sandbox_id, None)
            self.store.killed.add(sbx.sandbox_id)
        with sbx.lock:
            self._drop_processes(sbx)
            self.runtime.remove(sbx.container_id)
        self.volumes.sweep()  # a deleted volume this sandbox held can go now

    def pause(self, sbx: FakeSandbox) -> None:
        with sbx.lock:
            if sbx.state != "running":
                raise HttpError(409, f"sandbox {sbx.sandbox_id} is already paused")
            if self.store.is_cube and self.store.cube_pause_seconds > 0:
                # Cube C-later pauses asynchronously; lists show `pausing` meanwhile.
                sbx.state = "pausing"
                threading.Thread(target=self._finish_pause, args=(sbx,), daemon=True).start()
                return
            self.runtime.pause(sbx.container_id)
            sbx.state = "paused"

    def _finish_pause(self, sbx: FakeSandbox) -> None:
        time.sleep(self.store.cube_pause_seconds)
        with sbx.lock:
            if sbx.state == "pausing" and self.store.get(sbx.sandbox_id) is sbx:
                self.runtime.pause(sbx.container_id)
                sbx.state = "paused"

    def resume(self, sbx: FakeSandbox, timeout: int | None, *, reboot: bool = False) -> bool:
        """Resume if paused; returns True when it was paused. Resets the TTL when given.

        ``reboot`` (connect with ``memory: false``) or a filesystem-only auto-pause
        (``autoPauseMemory: false``) resumes with a cold boot: processes are gone."""
        with sbx.lock:
            if sbx.state == "pausing":
                raise HttpError(503, "sandbox is pausing", {"Retry-After": "2"})
            was_paused = sbx.state == "paused"
            if was_paused:
                if reboot or not sbx.auto_pause_memory:
                    self._drop_processes(sbx)
                    self.runtime.restart(sbx.container_id)
                else:
                    self.runtime.unpause(sbx.container_id)
                sbx.state = "running"
            if timeout is not None:
                sbx.set_ttl(timeout)
            elif was_paused:
                sbx.set_ttl(sbx.timeout)
            return was_paused

    def _drop_processes(self, sbx: FakeSandbox) -> None:
        for proc in list(sbx.processes.values()):
            with contextlib.suppress(OSError):
                proc.handle.sock.close()
        sbx.processes.clear()
        sbx.watchers.clear()

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self, sbx: FakeSandbox, name: str | None) -> Template:
        if self.store.is_cube:
            snapshot_id = "snap-" + secrets.token_hex(8)
            names = [name] if name else []
        else:
            # spec/openapi.yml SnapshotInfo: "team-slug/my-snapshot:default" when named,
            # otherwise the raw template id with its tag ("abc123:default").
            if name:
                snapshot_id = f"fake-team/{name if ':' in name else name + ':default'}"
                names = [snapshot_id]
            else:
                snapshot_id, names = new_id() + ":default", []
        with sbx.lock:
            try:
                image_id = self.runtime.commit(sbx.container_id, snapshot_id_tag(snapshot_id))
            except Exception as e:  # docker errors become a 500 of the API
                raise HttpError(500, f"snapshot failed: {e}") from e
        tpl = Template(
            template_id=snapshot_id,
            image=image_id,
            names=names,
            created_at=now(),
            kind="snapshot",
            origin_sandbox_id=sbx.sandbox_id,
        )
        with self.store.lock:
            self.store.templates[snapshot_id] = tpl
        return tpl

    def fork(self, sbx: FakeSandbox, count: int, timeout: int) -> list[FakeSandbox]:
        """``count`` new sandboxes starting from the origin's current filesystem."""
        with sbx.lock:
            image = self.runtime.commit(sbx.container_id, "fork-" + new_id("", 12))
        body = {
            "templateID": sbx.template_id,
            "timeout": timeout,
            "metadata": sbx.metadata,
            "envVars": sbx.env_vars,
            "autoPause": sbx.auto_pause,
            "autoResume": {"enabled": sbx.auto_resume},
            "secure": sbx.envd_access_token is not None,
        }
        return [self.create(dict(body), timeout, image=image) for _ in range(count)]

    def rollback(self, sbx: FakeSandbox, snapshot: Template) -> None:
        """Cube: replace the sandbox's filesystem with a snapshot's, keeping its id."""
        with sbx.lock:
            self._drop_processes(sbx)
            self.runtime.remove(sbx.container_id)
            sbx.container_id = self.runtime.create(sbx.sandbox_id, snapshot.image, sbx.env_vars, sbx.mounts)
            sbx.image = snapshot.image
            sbx.state = "running"
            sbx.set_ttl(sbx.timeout)

    def delete_template(self, template_id: str) -> Template:
        with self.store.lock:
            tpl = self.store.templates.pop(template_id, None)
        if tpl is None:
            raise HttpError(404, f"template '{template_id}' not found")
        if tpl.kind == "snapshot" or tpl.extra.get("built"):
            self.runtime.remove_image(tpl.image)
        return tpl

    # -- TTL ----------------------------------------------------------------------------------

    def reap_expired(self) -> None:
        t = now()
        with self.store.lock:
            due = [s for s in self.store.sandboxes.values() if s.state == "running" and s.end_at <= t]
        for sbx in due:
            if sbx.auto_pause:
                with contextlib.suppress(HttpError):
                    self.pause(sbx)
            else:
                self.kill(sbx)

    # -- data-plane access ----------------------------------------------------------------------

    def for_envd(self, sandbox_id: str) -> FakeSandbox:
        """The sandbox an envd request targets, resumed on traffic when allowed."""
        sbx = self.store.get(sandbox_id)
        if sbx is None:
            if self.store.is_cube and sandbox_id in self.store.killed:
                # CubeProxy: a killed sandbox is 410 Gone (docs/guide/lifecycle.md).
                raise HttpError(410, f"sandbox {sandbox_id} is gone")
            raise HttpError(502, f"The sandbox {sandbox_id} was not found")
        if sbx.state == "running":
            return sbx
        if self.store.is_cube or sbx.auto_resume:
            self._resume_on_traffic(sbx)
            return sbx
        # E2B's proxy answers 502 for a paused sandbox without auto-resume; the SDK reads a 502
        # as "sandbox not running".
        raise HttpError(502, f"The sandbox {sandbox_id} was not found")

    def _resume_on_traffic(self, sbx: FakeSandbox) -> None:
        with self.store.lock:
            fail = self.store.resume_failures > 0
            if fail:
                self.store.resume_failures -= 1
        if fail:
            # Cube: resume failure on the data plane is 503 + Retry-After (docs/guide/lifecycle.md).
            raise HttpError(503, "sandbox resume failed", {"Retry-After": "5"})
        try:
            self.resume(sbx, None)
        except RuntimeFailure as e:
            raise HttpError(503, str(e), {"Retry-After": "5"}) from e


def snapshot_id_tag(snapshot_id: str) -> str:
    """A Docker tag derived from a snapshot id (tags allow [A-Za-z0-9_.-], 128 chars)."""
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "-" for c in snapshot_id)
    return (cleaned.strip(".-") or "snapshot")[:120]
