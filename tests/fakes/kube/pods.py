"""The fake's kubelet: each pod a Docker container, each PVC a Docker volume.

Driven by docker-py directly (never the console's Docker adapter). A pod's containers run the
image of its spec, which must already be on this machine: the fake never pulls (nothing leaves
the machine), so a missing image shows as the kubelet shows it, `ErrImagePull` then
`ImagePullBackOff`, the pod Pending. Containers get `network_mode="none"` and
`dns=["127.0.0.1"]`, the pod name as host name, `command`/`args` as entrypoint/cmd, `env`
values, `workingDir` and `securityContext.runAsUser`/`runAsGroup` (the container's over the
pod's); a `persistentVolumeClaim` volume mounts the claim's Docker volume
(kept across pod deletions, so a suspended sandbox keeps its data), an `emptyDir` a volume that
goes with the pod. Everything is labelled with the cluster's run id and swept at the end.

Pod status is the kubelet's: phase, the conditions PodScheduled, Initialized, ContainersReady,
Ready, `containerStatuses` (state, ready, started, restartCount, image, containerID),
`hostIP`, `podIP(s)` and `startTime`. Pod IPs are addresses of 127.0.0.0/8, unique per pod:
the pods have no network, so no packet is ever addressed to them. A container that exits is
restarted under `restartPolicy: Always`; otherwise the pod ends Succeeded or Failed. PVCs are
bound at once (`status.phase: Bound`, capacity as requested).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from tests.fakes.kube.controller import ControllerLoop
from tests.fakes.kube.errors import ApiError
from tests.fakes.kube.resources import PODS, PVCS
from tests.fakes.kube.store import Obj, Store, now

if TYPE_CHECKING:
    from tests.fakes.kube.cluster import FakeCluster

log = logging.getLogger(__name__)

LABEL_RUN = "sandbox-console.fake-kube.run"
LABEL_POD = "sandbox-console.fake-kube.pod"
LABEL_PVC = "sandbox-console.fake-kube.pvc"
NODE_NAME = "fake-node"
HOST_IP = "127.0.0.1"
FIRST_POD_IP = ipaddress.ip_address("127.100.0.2")
STATUS_CHECK_SECONDS = 1.0


@dataclass
class PodRecord:
    uid: str
    namespace: str
    name: str
    containers: dict[str, str] = field(default_factory=dict)  # container name -> Docker id
    volumes: list[str] = field(default_factory=list)  # emptyDir volumes going with the pod
    ip: str = ""
    started: str = ""
    restarts: dict[str, int] = field(default_factory=dict)
    last_state: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> lastState
    backoff_until: dict[str, float] = field(default_factory=dict)  # name -> monotonic time
    pull_failures: int = 0
    run_error: str = ""  # the last failure to start a container (retried on the status checks)


def sweep(run_id: str) -> None:
    """Remove every container and volume labelled with `run_id`."""
    try:
        client = docker.from_env(timeout=60)
    except DockerException:
        return
    try:
        for container in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}):
            with contextlib.suppress(DockerException):
                container.remove(force=True, v=True)
        for volume in client.volumes.list(filters={"label": f"{LABEL_RUN}={run_id}"}):
            with contextlib.suppress(DockerException):
                volume.remove(force=True)
    finally:
        client.close()


class Kubelet:
    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.docker = docker.from_env(timeout=120)
        self.pods: dict[str, PodRecord] = {}
        self._lock = threading.Lock()
        self._next_ip = int(FIRST_POD_IP)
        self._last_check = 0.0

    # -- what tests ask -------------------------------------------------------------------------

    def container_of(self, namespace: str, pod: str) -> str:
        obj = self.store.find(PODS, namespace, pod)
        with self._lock:
            record = self.pods.get(obj["metadata"]["uid"]) if obj else None
            if record is None or not record.containers:
                raise KeyError(f"pod {namespace}/{pod} has no container (yet)")
            return next(iter(record.containers.values()))

    # -- the loop -------------------------------------------------------------------------------

    def reconcile(self) -> None:
        self._bind_claims()
        pods = {p["metadata"]["uid"]: p for p in self.store.items(PODS)}
        with self._lock:
            gone = [uid for uid in self.pods if uid not in pods]
        for uid in gone:
            self._remove(uid)
        self._drop_unclaimed_volumes()
        check = time.monotonic() - self._last_check >= STATUS_CHECK_SECONDS
        if check:
            self._last_check = time.monotonic()
        for uid, pod in pods.items():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                continue
            record = self.pods.get(uid)
            if record is None or not record.containers:
                if record is None or not record.run_error or check:
                    self._start(pod)
            elif check:
                self._check(pod, record)

    def _bind_claims(self) -> None:
        for pvc in self.store.items(PVCS):
            if (pvc.get("status") or {}).get("phase") == "Bound" or pvc["metadata"].get("deletionTimestamp"):
                continue
            uid = pvc["metadata"]["uid"]
            self._volume(self._claim_volume_name(uid), {LABEL_PVC: uid})
            spec = pvc.get("spec") or {}
            storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")

            def bind(obj: Obj, uid: str = uid) -> Obj:
                obj.setdefault("spec", {})["volumeName"] = f"pvc-{uid}"
                obj["spec"].setdefault("storageClassName", "standard")
                obj["spec"].setdefault("volumeMode", "Filesystem")
                return obj

            def bound(obj: Obj, storage: str = storage) -> Obj:
                obj["status"] = {
                    "phase": "Bound",
                    "accessModes": list((obj.get("spec") or {}).get("accessModes") or ["ReadWriteOnce"]),
                    "capacity": {"storage": storage},
                }
                return obj

            namespace, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
            with contextlib.suppress(ApiError):
                self.store.mutate(PVCS, namespace, name, bind)
                self.store.mutate(PVCS, namespace, name, bound, subresource="status")

    def _claim_volume_name(self, uid: str) -> str:
        return f"fake-kube-{self.run_id}-pvc-{uid}"

    def _volume(self, name: str, labels: dict[str, str]) -> str:
        try:
            self.docker.volumes.get(name)
        except NotFound:
            self.docker.volumes.create(name, labels={LABEL_RUN: self.run_id, **labels})
        return name

    def _drop_unclaimed_volumes(self) -> None:
        live = {p["metadata"]["uid"] for p in self.store.items(PVCS)}
        try:
            volumes = self.docker.volumes.list(filters={"label": f"{LABEL_RUN}={self.run_id}"})
        except DockerException:
            return
        for volume in volumes:
            uid = (volume.attrs.get("Labels") or {}).get(LABEL_PVC)
            if uid and uid not in live:
                with contextlib.suppress(DockerException):
                    volume.remove(force=True)

    # -- one pod -------------------------------------------------------------------------------

    def _write_status(self, pod: Obj, status: dict[str, Any], node: bool = True) -> None:
        """Write the pod's status (and its node) when they changed; a condition whose status
        did not change keeps its lastTransitionTime."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        previous = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        for cond in status.get("conditions") or []:
            old = previous.get(cond["type"])
            if old and old.get("status") == cond["status"]:
                cond["lastTransitionTime"] = old.get("lastTransitionTime")
        try:
            if node and pod.get("spec", {}).get("nodeName") != NODE_NAME:

                def schedule(obj: Obj) -> Obj:
                    obj["spec"]["nodeName"] = NODE_NAME
                    return obj

                self.store.mutate(PODS, namespace, name, schedule)

            def change(obj: Obj) -> Obj:
                obj["status"] = status
                return obj

            if (pod.get("status") or {}) != status:
                self.store.mutate(PODS, namespace, name, change, subresource="status")
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _pending(
        self, pod: Obj, record: PodRecord, scheduled: dict[str, Any], waiting: dict[str, dict[str, str]]
    ) -> None:
        statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": waiting.get(c["name"], {"reason": "ContainerCreating"})},
                "lastState": {},
            }
            for c in pod["spec"].get("containers") or []
        ]
        status: dict[str, Any] = {
            "phase": "Pending",
            "conditions": [scheduled] + ([self._cond("Initialized", "True")] if scheduled["status"] == "True" else []),
            "qosClass": "BestEffort",
        }
        if scheduled["status"] == "True":
            status.update({"hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}], "startTime": record.started})
            status["containerStatuses"] = statuses
            ready = self._cond(
                "Ready",
                "False",
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(s['name'] for s in statuses)}]",
            )
            status["conditions"] += [{**ready, "type": "ContainersReady"}, ready]
        self._write_status(pod, status, node=scheduled["status"] == "True")

    def _cond(self, kind: str, value: str, reason: str = "", message: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now()}
        if reason:
            out["reason"] = reason
        if message:
            out["message"] = message
        return out

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        uid, namespace = meta["uid"], meta["namespace"]
        with self._lock:
            record = self.pods.setdefault(uid, PodRecord(uid, namespace, meta["name"]))
        record.started = record.started or now()
        volumes: dict[str, str] = {}
        for volume in pod["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                pvc = self.store.find(PVCS, namespace, claim)
                if pvc is None:
                    message = (
                        f'0/1 nodes are available: persistentvolumeclaim "{claim}" not found. preemption: 0/1 '
                        "nodes are available: 1 Preemption is not helpful for scheduling."
                    )
                    self._pending(pod, record, self._cond("PodScheduled", "False", "Unschedulable", message), {})
                    return
                volumes[volume["name"]] = self._volume(
                    self._claim_volume_name(pvc["metadata"]["uid"]), {LABEL_PVC: pvc["metadata"]["uid"]}
                )
            elif "emptyDir" in volume:
                name = f"fake-kube-{self.run_id}-{uid[:8]}-{volume['name']}"
                volumes[volume["name"]] = self._volume(name, {LABEL_POD: uid})
                record.volumes.append(name)
        waiting: dict[str, dict[str, str]] = {}
        for container in pod["spec"].get("containers") or []:
            image = container.get("image", "")
            try:
                self.docker.images.get(image)
            except (ImageNotFound, APIError):
                record.pull_failures += 1
                if record.pull_failures > 1:
                    waiting[container["name"]] = {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}"',
                    }
                else:
                    waiting[container["name"]] = {
                        "reason": "ErrImagePull",
                        "message": f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                        "not found on this node (the fake kubelet never pulls)",
                    }
        if waiting:
            self._pending(pod, record, self._cond("PodScheduled", "True"), waiting)
            return
        self._pending(pod, record, self._cond("PodScheduled", "True"), {})
        if not record.ip:
            record.ip = str(ipaddress.ip_address(self._next_ip))
            self._next_ip += 1
        for container in pod["spec"].get("containers") or []:
            try:
                record.containers[container["name"]] = self._run(pod, container, volumes)
            except DockerException as exc:
                for cid in record.containers.values():
                    with contextlib.suppress(DockerException):
                        self.docker.api.remove_container(cid, force=True)
                record.containers.clear()
                record.run_error = str(getattr(exc, "explanation", None) or exc)
                failed = {container["name"]: {"reason": "RunContainerError", "message": record.run_error}}
                self._pending(pod, record, self._cond("PodScheduled", "True"), failed)
                return
        record.run_error = ""
        self._running(pod, record)

    def _run(self, pod: Obj, container: dict[str, Any], volumes: dict[str, str]) -> str:
        meta = pod["metadata"]
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            source = volumes.get(mount.get("name", ""))
            if source:
                mounts[source] = {"bind": mount["mountPath"], "mode": "ro" if mount.get("readOnly") else "rw"}
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if "name" in e}
        name = f"fake-kube-{self.run_id}-{meta['namespace']}-{meta['name']}-{container['name']}-{meta['uid'][:8]}"
        kwargs: dict[str, Any] = {
            "image": container["image"],
            "name": name[:200],
            "detach": True,
            "network_mode": "none",
            "dns": ["127.0.0.1"],
            "hostname": meta["name"][:63],
            "labels": {LABEL_RUN: self.run_id, LABEL_POD: meta["uid"]},
            "environment": env,
            "volumes": mounts,
            "stdin_open": bool(container.get("stdin")),
            "tty": bool(container.get("tty")),
        }
        if container.get("command"):
            kwargs["entrypoint"] = container["command"]
            kwargs["command"] = container.get("args") or []
        elif container.get("args"):
            kwargs["command"] = container["args"]
        if container.get("workingDir"):
            kwargs["working_dir"] = container["workingDir"]
        # The container's securityContext over the pod's; without runAsGroup the group is 0.
        security = {**(pod["spec"].get("securityContext") or {}), **(container.get("securityContext") or {})}
        if security.get("runAsUser") is not None:
            kwargs["user"] = f"{int(security['runAsUser'])}:{int(security.get('runAsGroup') or 0)}"
        with contextlib.suppress(NotFound):  # left over from a start that failed
            self.docker.api.remove_container(kwargs["name"], force=True)
        created = self.docker.containers.run(**kwargs)
        return str(created.id)

    def _running(self, pod: Obj, record: PodRecord, exited: dict[str, dict[str, Any]] | None = None) -> None:
        exited = exited or {}
        statuses = []
        for c in pod["spec"].get("containers") or []:
            cid = record.containers.get(c["name"], "")
            state: dict[str, Any] = exited.get(c["name"]) or {"running": {"startedAt": record.started}}
            running = "running" in state
            statuses.append(
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": f"docker-pullable://{c.get('image', '')}",
                    "containerID": f"docker://{cid}",
                    "ready": running,
                    "started": running,
                    "restartCount": record.restarts.get(c["name"], 0),
                    "state": state,
                    "lastState": record.last_state.get(c["name"], {}),
                }
            )
        all_ready = all(s["ready"] for s in statuses)
        if all_ready:
            ready = self._cond("Ready", "True")
        else:
            unready = " ".join(s["name"] for s in statuses if not s["ready"])
            ready = self._cond("Ready", "False", "ContainersNotReady", f"containers with unready status: [{unready}]")
        phase = "Running"
        policy = pod["spec"].get("restartPolicy", "Always")
        finished = [state for state in exited.values() if "terminated" in state]
        if finished and len(finished) == len(statuses) and policy != "Always":
            codes = [state["terminated"]["exitCode"] for state in finished]
            phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        conditions = [
            self._cond("PodReadyToStartContainers", "True"),
            self._cond("Initialized", "True"),
            {**ready, "type": "ContainersReady"},
            ready,
            self._cond("PodScheduled", "True"),
        ]
        status = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": record.ip,
            "podIPs": [{"ip": record.ip}],
            "startTime": record.started,
            "containerStatuses": statuses,
            "qosClass": "BestEffort",
        }
        self._write_status(pod, status)

    def _check(self, pod: Obj, record: PodRecord) -> None:
        """Notice exited containers: restart them (Always, OnFailure after a failure) with the
        kubelet's back-off (at once, then 10 s doubling to 5 min, shown as CrashLoopBackOff), or
        end the pod."""
        exited: dict[str, dict[str, Any]] = {}
        policy = pod["spec"].get("restartPolicy", "Always")
        for name, cid in list(record.containers.items()):
            try:
                state = self.docker.api.inspect_container(cid)["State"]
            except NotFound:
                state = {"Running": False, "ExitCode": 137, "StartedAt": "", "FinishedAt": ""}
            except DockerException:
                continue
            if state.get("Running"):
                continue
            code = int(state.get("ExitCode", 0))
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": (state.get("StartedAt") or record.started)[:19] + "Z",
                "finishedAt": (state.get("FinishedAt") or now())[:19] + "Z",
                "containerID": f"docker://{cid}",
            }
            if not (policy == "Always" or (policy == "OnFailure" and code != 0)):
                exited[name] = {"terminated": terminated}
                continue
            restarts = record.restarts.get(name, 0)
            until = record.backoff_until.get(name)
            if until is None:
                delay = 0 if restarts == 0 else min(10 * 2 ** (restarts - 1), 300)
                until = record.backoff_until[name] = time.monotonic() + delay
                record.last_state[name] = {"terminated": terminated}
            if time.monotonic() < until:
                meta = pod["metadata"]
                delay = min(10 * 2 ** max(restarts - 1, 0), 300)
                exited[name] = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {delay}s restarting failed container={name} "
                        f"pod={meta['name']}_{meta['namespace']}({meta['uid']})",
                    }
                }
                continue
            with contextlib.suppress(DockerException):
                self.docker.api.start(cid)
                record.restarts[name] = restarts + 1
                record.backoff_until.pop(name, None)
        self._running(pod, record, exited)

    def _remove(self, uid: str) -> None:
        with self._lock:
            record = self.pods.pop(uid, None)
        if record is None:
            return
        for cid in record.containers.values():
            with contextlib.suppress(DockerException):
                self.docker.api.remove_container(cid, force=True)
        for volume in record.volumes:
            with contextlib.suppress(DockerException):
                self.docker.volumes.get(volume).remove(force=True)

    def close(self) -> None:
        with self._lock:
            uids = list(self.pods)
        for uid in uids:
            self._remove(uid)
        self.docker.close()


def start_kubelet(cluster: FakeCluster) -> tuple[Kubelet, Callable[[], None]]:
    kubelet = Kubelet(cluster.store, cluster.run_id)
    loop = ControllerLoop("fake-kubelet", cluster.store, kubelet.reconcile, period=STATUS_CHECK_SECONDS)
    loop.start()

    def stop() -> None:
        loop.stop()
        kubelet.close()
        sweep(cluster.run_id)

    return kubelet, stop
