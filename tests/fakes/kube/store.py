"""The fake's etcd: objects by resource, one resourceVersion counter, list pages with
`continue` tokens, watch streams and a bounded event history.

Thread-safe: the HTTP handlers (the server's event loop), the controller and the kubelet
threads all write through it. Every write bumps the single resourceVersion counter and
appends one event to the history; the history keeps the last `history_size` events, and a
watch or a `continue` token from before its oldest one is answered 410 Expired, as after an
etcd compaction. Deleting an object deletes its dependents (ownerReferences) in the
background, the way the garbage collector does.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime as dt
import itertools
import json
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.kube.errors import ApiError, already_exists, bad_request, conflict, expired, invalid, not_found
from tests.fakes.kube.resources import NAMESPACES, Resource
from tests.fakes.kube.selection import Matcher, metadata_causes

Obj = dict[str, Any]
Validator = Callable[[Resource, Obj, Obj | None], list[dict[str, str]]]

NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    rv: int
    resource: tuple[str, str]  # (group, plural)
    type: str  # ADDED / MODIFIED / DELETED
    obj: Obj
    old: Obj | None = None  # the object before a MODIFIED or DELETED event


@dataclass
class Watcher:
    resource: tuple[str, str]
    namespace: str | None
    deliver: Callable[[Event], None]
    matches: Matcher = field(default=lambda obj: True)


@dataclass
class Page:
    items: list[Obj]
    resource_version: str
    continue_token: str | None
    remaining: int | None


def _random_suffix() -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    raw = uuid.uuid4().int
    return "".join(alphabet[(raw >> (5 * i)) % len(alphabet)] for i in range(5))


class Store:
    def __init__(self, history_size: int = 1000) -> None:
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = itertools.count(1)
        self._last_rv = 0
        self._history: deque[Event] = deque(maxlen=history_size)
        self._compacted = 0  # events with rv <= this are gone
        self._watchers: list[Watcher] = []
        self._validators: list[Validator] = []
        self.resources: dict[tuple[str, str], Resource] = {}

    # -- setup ------------------------------------------------------------------------------

    def register(self, resource: Resource) -> None:
        self.resources[resource.key] = resource
        self._objects.setdefault(resource.key, {})

    def add_validator(self, validator: Validator) -> None:
        self._validators.append(validator)

    @property
    def resource_version(self) -> int:
        return self._last_rv

    @property
    def oldest_resource_version(self) -> int:
        """The oldest rv a watch may start from (older ones are answered 410)."""
        return self._compacted

    def compact(self) -> None:
        """Forget the whole event history now (as `etcdctl compact` at the current revision)."""
        with self._lock:
            self._history.clear()
            self._compacted = self._last_rv

    # -- internals ----------------------------------------------------------------------------

    def _bucket(self, resource: Resource) -> dict[tuple[str, str], Obj]:
        return self._objects.setdefault(resource.key, {})

    def _next_rv(self) -> int:
        self._last_rv = next(self._rv)
        return self._last_rv

    def _emit(self, resource: Resource, kind: str, obj: Obj, old: Obj | None = None) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        event = Event(rv, resource.key, kind, copy.deepcopy(obj), copy.deepcopy(old) if old else None)
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(event)
        for w in list(self._watchers):
            seen = self._as_seen_by(w, event)
            if seen is not None:
                w.deliver(seen)

    @staticmethod
    def _as_seen_by(w: Watcher, event: Event) -> Event | None:
        """The event as a watch with a selector sees it: an object that comes to match is
        ADDED, one that stops matching is DELETED (as the watch cache sends them)."""
        if w.resource == ("*", "*"):
            return event
        if w.resource != event.resource:
            return None
        if w.namespace and event.obj["metadata"].get("namespace") != w.namespace:
            return None
        now_matches = w.matches(event.obj)
        if event.type != "MODIFIED" or event.old is None:
            return event if now_matches else None
        matched = w.matches(event.old)
        if now_matches and matched:
            return event
        if now_matches:
            return Event(event.rv, event.resource, "ADDED", event.obj)
        if matched:
            return Event(event.rv, event.resource, "DELETED", event.obj)
        return None

    def _key(self, resource: Resource, namespace: str | None, name: str) -> tuple[str, str]:
        return ((namespace or "") if resource.namespaced else "", name)

    def _validate(self, resource: Resource, obj: Obj, old: Obj | None) -> None:
        causes: list[dict[str, str]] = []
        name = obj.get("metadata", {}).get("name", "")
        pattern = NAMESPACE_NAME if resource is NAMESPACES or resource.plural == "namespaces" else NAME
        if name and not pattern.match(name):
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                    "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                    "field": "metadata.name",
                }
            )
        causes.extend(metadata_causes(obj.get("metadata") or {}))
        for validator in self._validators:
            causes.extend(validator(resource, obj, old))
        if causes:
            raise invalid(resource.kind, resource.group, name, causes)

    def _require_namespace(self, resource: Resource, namespace: str | None) -> None:
        if not resource.namespaced:
            return
        if not namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        if (("", namespace)) not in self._bucket(NAMESPACES):
            raise not_found("namespaces", "", namespace)

    # -- reads ---------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        with self._lock:
            obj = self._bucket(resource).get(self._key(resource, namespace, name))
            if obj is None:
                raise not_found(resource.plural, resource.group, name)
            return copy.deepcopy(obj)

    def find(self, resource: Resource, namespace: str | None, name: str) -> Obj | None:
        try:
            return self.get(resource, namespace, name)
        except ApiError:
            return None

    def items(self, resource: Resource, namespace: str | None = None, matches: Matcher | None = None) -> list[Obj]:
        """All objects (copies), ordered by namespace and name."""
        with self._lock:
            out = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._bucket(resource).items())
                if (not namespace or ns == namespace) and (matches is None or matches(obj))
            ]
        return out

    def list(
        self,
        resource: Resource,
        namespace: str | None,
        matches: Matcher,
        *,
        limit: int = 0,
        continue_token: str | None = None,
        selective: bool = False,
    ) -> Page:
        with self._lock:
            start = ""
            rv = self._last_rv
            bucket = self._bucket(resource)
            if continue_token:
                rv, start = self._decode_continue(continue_token)
                bucket = self._as_of(resource, rv)
            selected = [
                (key, obj)
                for key, obj in sorted(bucket.items())
                if (not namespace or key[0] == namespace) and "/".join(key) > start and matches(obj)
            ]
            token = None
            remaining = None
            if limit and len(selected) > limit:
                last_key = selected[limit - 1][0]
                token = self._encode_continue(rv, "/".join(last_key))
                remaining = None if selective else len(selected) - limit
                selected = selected[:limit]
            return Page([copy.deepcopy(o) for _, o in selected], str(rv), token, remaining)

    def _as_of(self, resource: Resource, rv: int) -> dict[tuple[str, str], Obj]:
        """The resource's objects as they were at `rv` (the history rewound), so the pages of
        one list are one consistent snapshot, as etcd serves them."""
        objects = dict(self._bucket(resource))
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.resource != resource.key:
                continue
            meta = event.obj["metadata"]
            key = self._key(resource, meta.get("namespace"), meta["name"])
            if event.type == "ADDED":
                objects.pop(key, None)
            elif event.old is not None:
                objects[key] = event.old
        return objects

    def _encode_continue(self, rv: int, start: str) -> str:
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"}, separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    def _decode_continue(self, token: str) -> tuple[int, str]:
        try:
            padded = token + "=" * (-len(token) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded))
            if data.get("v") != "meta.k8s.io/v1":
                raise ValueError(
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
                )
            rv, start = int(data["rv"]), str(data["start"])
        except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
            raise bad_request(f"continue key is not valid: {exc}") from None
        if rv <= 0 or rv > self._last_rv:
            raise bad_request(
                "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
            )
        if rv < self._compacted:
            raise expired(EXPIRED_CONTINUE)
        return rv, start.rstrip("\x00")

    # -- writes --------------------------------------------------------------------------------

    def create(self, resource: Resource, namespace: str | None, obj: Obj, *, dry_run: bool = False) -> Obj:
        with self._lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise bad_request("metadata must be an object")
            if meta.get("resourceVersion"):
                raise bad_request("resourceVersion should not be set on objects to be created")
            if resource.namespaced:
                body_ns = meta.get("namespace")
                if body_ns and namespace and body_ns != namespace:
                    raise bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request"
                    )
                namespace = namespace or body_ns
                self._require_namespace(resource, namespace)
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = f"{meta['generateName']}{_random_suffix()}"
                else:
                    raise invalid(
                        resource.kind,
                        resource.group,
                        "",
                        [
                            {
                                "reason": "FieldValueRequired",
                                "message": "Required value: name or generateName is required",
                                "field": "metadata.name",
                            }
                        ],
                    )
            obj["apiVersion"] = resource.api_version
            obj["kind"] = resource.kind
            self._validate(resource, obj, None)
            key = self._key(resource, namespace, meta["name"])
            if key in self._bucket(resource):
                raise already_exists(resource.plural, resource.group, meta["name"])
            for stale in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(stale, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
            if resource.plural == "namespaces":
                obj["spec"] = {"finalizers": ["kubernetes"]}
                obj["status"] = {"phase": "Active"}
            if dry_run:
                meta["resourceVersion"] = ""
                return obj
            meta["resourceVersion"] = str(self._next_rv())
            self._bucket(resource)[key] = obj
            self._emit(resource, "ADDED", obj)
            return copy.deepcopy(obj)

    def update(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        obj: Obj,
        *,
        subresource: str | None = None,
        check_version: bool = True,
    ) -> Obj:
        """Replace an object (PUT). With the `status` subresource only `.status` changes; without
        it a resource having a status subresource keeps its status. A stale
        `metadata.resourceVersion` is a 409 Conflict."""
        with self._lock:
            key = self._key(resource, namespace, name)
            old = self._bucket(resource).get(key)
            if old is None:
                raise not_found(resource.plural, resource.group, name)
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
                )
            sent_rv = meta.get("resourceVersion")
            if check_version and sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise conflict(resource.plural, resource.group, name)
            if subresource == "status":
                merged = copy.deepcopy(old)
                merged["status"] = new.get("status")
                if merged["status"] is None:
                    merged.pop("status")
                new = merged
            else:
                if "status" in resource.subresources:
                    new.pop("status", None)
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                new["metadata"] = self._kept_metadata(old["metadata"], meta)
            new["apiVersion"] = resource.api_version
            new["kind"] = resource.kind
            self._validate(resource, new, old)
            if new == old:
                return copy.deepcopy(old)  # a no-op write keeps the resourceVersion, as the apiserver does
            if {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
                k: v for k, v in old.items() if k not in ("metadata", "status")
            }:
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            new["metadata"]["resourceVersion"] = str(self._next_rv())
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                del self._bucket(resource)[key]
                self._emit(resource, "DELETED", new, old)
                self._collect_dependents(new["metadata"]["uid"])
                return copy.deepcopy(new)
            self._bucket(resource)[key] = new
            self._emit(resource, "MODIFIED", new, old)
            return copy.deepcopy(new)

    @staticmethod
    def _kept_metadata(old: Obj, sent: Obj) -> Obj:
        """What a client may change in metadata; the server keeps the rest."""
        meta = copy.deepcopy(old)
        for field_name in ("labels", "annotations", "finalizers", "ownerReferences"):
            if field_name in sent and sent[field_name] is not None:
                meta[field_name] = copy.deepcopy(sent[field_name])
            else:
                meta.pop(field_name, None)
        return meta

    def mutate(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        *,
        subresource: str | None = None,
    ) -> Obj:
        """Read-modify-write under the lock (PATCH, and the controllers' status writes)."""
        with self._lock:
            current = self.get(resource, namespace, name)
            changed = change(copy.deepcopy(current))
            sent_rv = changed.get("metadata", {}).get("resourceVersion")
            check = bool(sent_rv) and sent_rv != current["metadata"]["resourceVersion"]
            if check:
                raise conflict(resource.plural, resource.group, name)
            changed.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            return self.update(resource, namespace, name, changed, subresource=subresource)

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        precondition_rv: str | None = None,
        precondition_uid: str | None = None,
    ) -> Obj:
        with self._lock:
            key = self._key(resource, namespace, name)
            obj = self._bucket(resource).get(key)
            if obj is None:
                raise not_found(resource.plural, resource.group, name)
            if precondition_uid and precondition_uid != obj["metadata"]["uid"]:
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {resource.plural} "{name}": Precondition failed: '
                    f"UID in precondition: {precondition_uid}, UID in object meta: {obj['metadata']['uid']}",
                    "Conflict",
                )
            if precondition_rv and precondition_rv != obj["metadata"]["resourceVersion"]:
                raise conflict(resource.plural, resource.group, name)
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    before, obj = obj, copy.deepcopy(obj)
                    obj["metadata"]["deletionTimestamp"] = now()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 0
                    obj["metadata"]["resourceVersion"] = str(self._next_rv())
                    self._bucket(resource)[key] = obj
                    self._emit(resource, "MODIFIED", obj, before)
                return copy.deepcopy(obj)
            del self._bucket(resource)[key]
            gone = copy.deepcopy(obj)
            gone["metadata"]["resourceVersion"] = str(self._next_rv())
            self._emit(resource, "DELETED", gone, obj)
            if resource.plural == "namespaces" and not resource.group:
                self._delete_namespace_contents(name)
            if propagation != "Orphan":
                self._collect_dependents(obj["metadata"]["uid"])
            return gone

    def _delete_namespace_contents(self, namespace: str) -> None:
        for res_key, bucket in self._objects.items():
            resource = self.resources.get(res_key)
            if resource is None or not resource.namespaced:
                continue
            for ns, name in [k for k in bucket if k[0] == namespace]:
                self._force_delete(resource, ns, name)

    def _force_delete(self, resource: Resource, namespace: str, name: str) -> None:
        obj = self._bucket(resource).pop((namespace, name), None)
        if obj is None:
            return
        before = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._emit(resource, "DELETED", obj, before)
        self._collect_dependents(obj["metadata"]["uid"])

    def _collect_dependents(self, owner_uid: str) -> None:
        """The garbage collector: objects whose every owner is gone follow their owner."""
        live = {o["metadata"]["uid"] for bucket in self._objects.values() for o in bucket.values()}
        for res_key, bucket in list(self._objects.items()):
            resource = self.resources.get(res_key)
            if resource is None:
                continue
            for key, obj in list(bucket.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                uids = {r.get("uid") for r in refs}
                if owner_uid in uids and not (uids & live):
                    if obj["metadata"].get("finalizers"):
                        self.delete(resource, key[0] or None, key[1])
                    else:
                        self._force_delete(resource, key[0], key[1])

    # -- watch ----------------------------------------------------------------------------------

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        since: str | None,
        matches: Matcher,
        deliver: Callable[[Event], None],
    ) -> Callable[[], None]:
        """Send `deliver` the events after `since` (or the current objects as ADDED when
        `since` is empty or "0"), then every new one, until the returned function is called.
        A `since` older than the history is a 410 Expired ApiError."""
        with self._lock:
            if since and since != "0":
                try:
                    start = int(since)
                except ValueError:
                    raise bad_request(f'invalid resource version "{since}"') from None
                if start < self._compacted:
                    raise expired(f"too old resource version: {start} ({self._compacted + 1})")
                watcher = Watcher(resource.key, namespace, deliver, matches)
                for event in list(self._history):
                    seen = self._as_seen_by(watcher, event) if event.rv > start else None
                    if seen is not None:
                        deliver(seen)
            else:
                for obj in self.items(resource, namespace, matches):
                    deliver(Event(int(obj["metadata"]["resourceVersion"]), resource.key, "ADDED", obj))
            return self._add_watcher(Watcher(resource.key, namespace, deliver, matches))

    def subscribe(self, deliver: Callable[[Event], None]) -> Callable[[], None]:
        """Every event of every resource (the controllers' informer)."""
        return self._add_watcher(Watcher(("*", "*"), None, deliver))

    def _add_watcher(self, watcher: Watcher) -> Callable[[], None]:
        with self._lock:
            self._watchers.append(watcher)

        def stop() -> None:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

        return stop
