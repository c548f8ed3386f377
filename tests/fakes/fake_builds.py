"""E2B template builds in the fake (spec/openapi.yml: POST /v3/templates,
POST /v2/templates/{templateID}/builds/{buildID}, GET /templates/{templateID}/builds/{buildID}/status).

A build really happens: a container from ``fromImage`` (a local image: the fake never pulls)
or ``fromTemplate``, the RUN/ENV/WORKDIR/USER steps executed in it, then ``docker commit``.
COPY steps need the file-upload flow, which the fake does not offer: they fail the build with
a clear reason.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.fake_http import HttpError
from tests.fakes.fake_runtime import RuntimeFailure
from tests.fakes.fake_state import Store, Template, new_id, now, rfc3339

MAX_LOG_ENTRIES = 100  # the status endpoint returns at most 100 entries per call


@dataclass
class Build:
    template_id: str
    build_id: str
    status: str = "waiting"  # waiting | building | ready | error
    entries: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None

    def log(self, message: str, level: str = "info", step: int | None = None) -> None:
        entry: dict[str, Any] = {"timestamp": rfc3339(now()), "level": level, "message": message}
        if step is not None:
            entry["step"] = str(step)
        self.entries.append(entry)

    def fail(self, message: str, step: int | None = None) -> None:
        self.log(message, "error", step)
        self.reason = {"message": message, **({"step": str(step)} if step is not None else {})}
        self.status = "error"


class Builds:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.runtime = store.runtime
        self.builds: dict[tuple[str, str], Build] = {}

    def request(self, body: dict[str, Any]) -> tuple[Template, Build]:
        """POST /v3/templates: a template (new, or the one already holding the name) and a
        fresh build waiting for its steps."""
        name = body.get("name") or body.get("alias")
        if not isinstance(name, str) or not name:
            raise HttpError(400, "name is required")
        base, _, tag = name.partition(":")
        tags = list(body.get("tags") or ([tag] if tag else ["default"]))
        with self.store.lock:
            tpl = next(
                (t for t in self.store.templates.values() if t.kind == "template" and base in t.names),
                None,
            )
            if tpl is None:
                tpl = Template(
                    template_id=new_id(),
                    image="",
                    names=[base],
                    created_at=now(),
                    status="waiting",
                )
                self.store.templates[tpl.template_id] = tpl
            tpl.build_id = str(uuid.uuid4())  # infra build ids are UUIDs
            tpl.extra["tags"] = tags
            build = Build(tpl.template_id, tpl.build_id)
            self.builds[(tpl.template_id, tpl.build_id)] = build
        return tpl, build

    def get(self, template_id: str, build_id: str) -> Build:
        build = self.builds.get((template_id, build_id))
        if build is None:
            raise HttpError(404, f"build {build_id} of template {template_id} not found")
        return build

    def start(self, template_id: str, build_id: str, spec: dict[str, Any]) -> None:
        """POST /v2/templates/{id}/builds/{bid}: run the build in the background."""
        build = self.get(template_id, build_id)
        if build.status != "waiting":
            raise HttpError(409, f"build {build_id} was already started")
        build.status = "building"
        threading.Thread(target=self._run, args=(build, spec), daemon=True).start()

    def status(self, build: Build, offset: int, limit: int, level: str | None) -> dict[str, Any]:
        entries = build.entries[offset:]
        if level:
            order = ["debug", "info", "warn", "error"]
            entries = [e for e in entries if order.index(e["level"]) >= order.index(level)]
        entries = entries[: min(limit, MAX_LOG_ENTRIES)]
        out: dict[str, Any] = {
            "logs": [e["message"] for e in entries],
            "logEntries": entries,
            "templateID": build.template_id,
            "buildID": build.build_id,
            "status": build.status,
        }
        if build.reason:
            out["reason"] = build.reason
        return out

    # -- the build itself ----------------------------------------------------------------------

    def _base_image(self, spec: dict[str, Any]) -> str:
        if spec.get("fromTemplate"):
            base = self.store.resolve_template(str(spec["fromTemplate"]))
            if base is None or not base.image:
                raise RuntimeFailure(f"template {spec['fromTemplate']} not found")
            return base.image
        image = spec.get("fromImage") or self.runtime.default_image
        if spec.get("fromImageRegistry"):
            raise RuntimeFailure("private registries are not supported by the fake")
        if not self.runtime.image_exists(str(image)):
            raise RuntimeFailure(f"image {image} is not available locally (the fake never pulls)")
        return str(image)

    def _run(self, build: Build, spec: dict[str, Any]) -> None:
        tpl = self.store.templates.get(build.template_id)
        container_id = ""
        try:
            image = self._base_image(spec)
            build.log(f"Building from {image}")
            container_id = self.runtime.create("build-" + secrets.token_hex(6), image, {})
            env, ok = self._steps(build, container_id, spec.get("steps") or [])
            if ok:
                image_id = self.runtime.commit(container_id, "template-" + build.template_id, env=env)
                if tpl is not None:
                    tpl.image, tpl.status = image_id, "ready"
                    tpl.extra["built"] = True
                build.log("Build finished")
                build.status = "ready"
        except (RuntimeFailure, OSError) as e:
            build.fail(str(e))
        finally:
            if tpl is not None and build.status == "error" and not tpl.image:
                tpl.status = "error"
            if container_id:
                self.runtime.remove(container_id)

    def _steps(self, build: Build, container_id: str, steps: list[dict[str, Any]]) -> tuple[dict[str, str], bool]:
        env: dict[str, str] = {}
        user, workdir = "root", "/"
        for index, step in enumerate(steps, start=1):
            kind, args = step.get("type"), list(step.get("args") or [])
            build.log(f"[{index}] {kind} {' '.join(args)}", step=index)
            if kind == "ENV":
                env.update(dict(zip(args[::2], args[1::2], strict=False)))
            elif kind == "USER":
                user = args[0]
            elif kind == "WORKDIR":
                workdir = args[0]
                self.runtime.run_capture(container_id, ["mkdir", "-p", workdir], user="root")
            elif kind == "RUN":
                cmd, run_user = args[0], args[1] if len(args) > 1 else user
                code, out, err = self.runtime.run_capture(
                    container_id, ["/bin/sh", "-c", cmd], user=run_user, envs=env, cwd=workdir
                )
                for line in (out + err).decode(errors="replace").splitlines():
                    build.log(line, step=index)
                if code != 0:
                    build.fail(f"step {index} ({cmd}) exited with code {code}", step=index)
                    return env, False
            else:
                build.fail(f"step type {kind} is not supported by the fake", step=index)
                return env, False
        return env, True
