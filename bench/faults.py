"""Fault campaign: real sessions through the agent API while the console's parts are broken.

Two consoles, each on the real Docker engine, driven over HTTP on 127.0.0.1 only:
- embedded: one Daphne process on SQLite (the `make start` default);
- scaled: two Daphne replicas, a Celery worker and beat, on a PostgreSQL cluster and a Redis
  server of this script's own (initdb/pg_ctl and redis-server on free ports), so killing or
  restarting them touches nothing shared.

Half of each console's sessions are busy: a traffic thread keeps resolving them and reading
their files through the live web processes the whole time. The other half stay quiet (an
agent between turns; one of the embedded ones paused through the session page), which is
where a reaper that only asks "does a binding own it?" does its damage. The faults, one
after another:
  restart-embedded    every process of the embedded console stopped and started again
  restart-scaled      every process of the scaled console (both replicas, worker, beat)
  redis-flush         FLUSHALL on the scaled console's Redis
  redis-restart       its Redis killed (-9) and started again, empty
  lease-expiry        a replica frozen (SIGSTOP) once its new session's sandbox exists (it holds
                      the lifecycle lock, it has not bound), past the lock's lease (60 s); the
                      other replica resolves the same session meanwhile; then it is thawed and
                      both must answer with one sandbox
  kill-before-bind    a replica killed (-9) once its new sandbox exists and before it is bound;
                      the session's next resolve waits out the dead holder's lock lease
  postgres-restart    the scaled console's PostgreSQL restarted (fast shutdown)
After each fault the campaign waits past the reaper's grace for two passes (both shortened by
their settings), then checks every session that exists.

Counted (the last line is JSON):
- `lost`: a session whose sandbox (the one its last answer named) or whose /workspace file
  disappeared while the session existed;
- `duplicates`: a session with two live sandboxes after the reaper's next passes;
- `server_errors`: answers 5xx other than the documented 503 while a store (Redis,
  PostgreSQL) is down; `conflicts`: answers 409 (the agent sees an error it did not cause);
- `unanswered`: requests that got no HTTP answer (a process down or frozen: expected).

Usage: python bench/faults.py [--only NAME,NAME] [--keep] [--lock-ttl-s S]
Needs the Docker engine with sandbox-console/base:latest, redis-server and the PostgreSQL
binaries. Every sandbox and volume carries the run's installation ids and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.console_process import (  # noqa: E402
    Console,
    PostgresServer,
    RedisServer,
    docker_api,
    live_sandboxes,
    remove_docker_leftovers,
)
from tests.support.tuning import tuning_env  # noqa: E402

GRACE_S = 3
FAST_REAPER = tuning_env(
    {"sessions.reaper_grace_s": GRACE_S, "sessions.reaper_interval_s": 2, "sessions.idle_sweep_interval_s": 3600}
)
STORE_SETTLE_S = 5.0  # a 503 this long after a store came back still counts as "store down"
REQUEST_TIMEOUT_S = 20.0


@dataclass
class Tally:
    """What the agent saw, per fault."""

    requests: int = 0
    server_errors: int = 0
    store_down_503: int = 0
    conflicts: int = 0
    unanswered: int = 0
    other_4xx: int = 0
    samples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.samples) < 5:
            self.samples.append(text[:300])


@dataclass
class Fleet:
    """One console and the sessions the campaign drives on it."""

    name: str
    console: Console
    sessions: dict[str, str] = field(default_factory=dict)  # key -> the sandbox its last answer named
    quiet: set[str] = field(default_factory=set)  # sessions the traffic leaves alone (an idle agent)
    blocked: set[str] = field(default_factory=set)  # web processes not to send traffic to now

    def webs(self) -> list[str]:
        return [name for name in self.console.processes if name.startswith("web") and name not in self.blocked]


class Campaign:
    def __init__(self, workdir: Path, lock_ttl_s: float) -> None:
        self.workdir = workdir
        self.lock_ttl_s = lock_ttl_s
        self.run_id = uuid.uuid4().hex[:8]
        self.fleets: list[Fleet] = []
        self.tallies: dict[str, Tally] = {}
        self.current = "setup"
        self.store_down_until = 0.0  # monotonic time; a store is down (or settling) before it
        self.store_down = False
        self.lock = threading.Lock()
        self.stop_traffic = threading.Event()
        self.results: list[dict[str, Any]] = []
        self.redis: RedisServer | None = None
        self.postgres: PostgresServer | None = None

    # Bookkeeping ------------------------------------------------------------------------

    def tally(self) -> Tally:
        return self.tallies.setdefault(self.current, Tally())

    def record(self, fleet: Fleet, web: str, what: str, status: int | None, body: Any) -> None:
        with self.lock:
            tally = self.tally()
            tally.requests += 1
            if status is None:
                tally.unanswered += 1
            elif status == 503 and (self.store_down or time.monotonic() < self.store_down_until):
                tally.store_down_503 += 1
            elif status >= 500:
                tally.server_errors += 1
                tally.note(f"{fleet.name}/{web} {what}: {status} {body}")
            elif status == 409:
                tally.conflicts += 1
                tally.note(f"{fleet.name}/{web} {what}: 409 {body}")
            elif status >= 400:
                tally.other_4xx += 1
                tally.note(f"{fleet.name}/{web} {what}: {status} {body}")

    def call(self, fleet: Fleet, web: str, what: str, key: str, *, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        """One request through web process `web`; the answer's body, or None."""
        api = fleet.console.api(web)
        api.timeout = timeout
        try:
            answer = api.resolve(key) if what == "resolve" else api.shell(key, "cat /workspace/kept.txt")
        except OSError as exc:
            self.record(fleet, web, what, None, str(exc))
            return None
        self.record(fleet, web, what, answer.status, answer.body)
        if answer.status != 200:
            return None
        if what == "resolve" and isinstance(answer.body, dict):
            with self.lock:
                fleet.sessions[key] = answer.body["sandbox_id"]
        return answer.body

    # Traffic ----------------------------------------------------------------------------

    def traffic(self) -> None:
        rng = random.Random(self.run_id)
        while not self.stop_traffic.is_set():
            fleets = [fleet for fleet in self.fleets if fleet.sessions and fleet.webs()]
            if not fleets:
                time.sleep(0.2)
                continue
            fleet = rng.choice(fleets)
            with self.lock:
                busy = sorted(set(fleet.sessions) - fleet.quiet)
            if not busy:
                time.sleep(0.2)
                continue
            key = rng.choice(busy)
            webs = fleet.webs()
            if webs:
                self.call(fleet, rng.choice(webs), rng.choice(["resolve", "read"]), key)
            time.sleep(0.15)

    # Sessions and checks ----------------------------------------------------------------

    def drive(self, fleet: Fleet, keys: list[str], web: str = "web", *, quiet: bool = False) -> None:
        api = fleet.console.api(web)
        for key in keys:
            answer = api.resolve(key)
            if answer.status != 200:
                raise RuntimeError(f"could not start session {key}: {answer.status} {answer.body}")
            wrote = api.shell(key, f"echo {key} > /workspace/kept.txt")
            if wrote.status != 200 or wrote.body["exit_code"] != 0:
                raise RuntimeError(f"could not write in session {key}: {wrote.body}")
            with self.lock:
                fleet.sessions[key] = answer.body["sandbox_id"]
                if quiet:
                    fleet.quiet.add(key)

    def check(self, fault: str, fleets: list[Fleet]) -> dict[str, Any]:
        """After the reaper's passes: every session keeps its sandbox and /workspace, one sandbox each."""
        lost: list[str] = []
        duplicates: list[str] = []
        for fleet in fleets:
            live = live_sandboxes(fleet.console.installation_id)
            with self.lock:
                expected = dict(fleet.sessions)
            for key, sandbox_id in expected.items():
                ids = live.get(key, [])
                where = f"{fault}: {fleet.name}/{key}" + (" (quiet)" if key in fleet.quiet else "")
                if len(ids) > 1:
                    duplicates.append(f"{where}: {len(ids)} sandboxes")
                web = fleet.webs()[0]
                if sandbox_id not in ids:
                    lost.append(f"{where}: sandbox {sandbox_id[:12]} gone")
                else:
                    answer = fleet.console.api(web).shell(key, "cat /workspace/kept.txt")
                    if answer.status == 200 and answer.body.get("stdout") == f"{key}\n":
                        continue
                    lost.append(f"{where}: /workspace answered {answer.status} {answer.body}")
                # A new baseline for the next fault: the sandbox it has now, with its file.
                self.drive(fleet, [key], web=web, quiet=key in fleet.quiet)
        return {"fault": fault, "lost": lost, "duplicates": duplicates}

    @contextmanager
    def fault(self, name: str, fleets: list[Fleet]) -> Iterator[dict[str, Any]]:
        print(f"==> {name}", flush=True)
        started = time.monotonic()
        self.current = name
        info: dict[str, Any] = {}
        yield info
        time.sleep(GRACE_S + 1)
        for fleet in fleets:
            fleet.console.wait_for_reaper_passes(2, timeout=120)
        result = {**self.check(name, fleets), **info}
        tally = self.tallies.get(name, Tally())
        result.update(
            server_errors=tally.server_errors,
            conflicts=tally.conflicts,
            store_down_503=tally.store_down_503,
            unanswered=tally.unanswered,
            requests=tally.requests,
            samples=tally.samples,
            seconds=round(time.monotonic() - started, 1),
        )
        self.results.append(result)
        print(f"    {json.dumps(result)}", flush=True)
        self.current = f"after {name}"

    def store_is_down(self, down: bool) -> None:
        self.store_down = down
        if not down:
            self.store_down_until = time.monotonic() + STORE_SETTLE_S

    # The consoles -----------------------------------------------------------------------

    def embedded(self) -> Fleet:
        workdir = self.workdir / "embedded"
        console = Console(
            workdir=workdir,
            installation_id=f"faults-e-{self.run_id}",
            database_url=f"sqlite:///{workdir / 'console.sqlite3'}",
            extra_env=FAST_REAPER,
        )
        fleet = Fleet("embedded", console)
        self.fleets.append(fleet)
        console.set_up()
        console.start_all()
        return fleet

    def scaled(self) -> Fleet:
        self.redis = RedisServer(self.workdir)
        self.redis.start()
        self.postgres = PostgresServer(self.workdir)
        self.postgres.init()
        self.postgres.start()
        console = Console(
            workdir=self.workdir / "scaled",
            installation_id=f"faults-s-{self.run_id}",
            database_url=self.postgres.create_database("console"),
            redis_url=self.redis.url,
            extra_env=FAST_REAPER,
        )
        fleet = Fleet("scaled", console)
        self.fleets.append(fleet)
        console.set_up()
        console.start_web("web")
        console.start_web("web2")
        console.start_worker()
        console.start_beat()
        return fleet

    # Faults -----------------------------------------------------------------------------

    def restart(self, fleet: Fleet) -> None:
        with self.fault(f"restart-{fleet.name}", [fleet]) as info:
            names = list(fleet.console.processes)
            started = time.monotonic()
            fleet.console.stop_all()
            info["stop_s"] = round(time.monotonic() - started, 1)
            fleet.console.start_named(names)
            info["down_s"] = round(time.monotonic() - started, 1)

    def redis_flush(self, fleet: Fleet) -> None:
        assert self.redis is not None
        with self.fault("redis-flush", [fleet]):
            self.redis.flush()

    def redis_restart(self, fleet: Fleet) -> None:
        assert self.redis is not None
        with self.fault("redis-restart", [fleet]):
            self.store_is_down(True)
            self.redis.kill()
            time.sleep(3)  # traffic meanwhile: 503 is the documented answer
            self.redis.start()
            self.store_is_down(False)

    def postgres_restart(self, fleet: Fleet) -> None:
        assert self.postgres is not None
        with self.fault("postgres-restart", [fleet]):
            self.store_is_down(True)
            self.postgres.stop("fast")
            time.sleep(2)
            self.postgres.start()
            self.store_is_down(False)

    def lease_expiry(self, fleet: Fleet) -> None:
        """A holder stalls past its lock lease while it creates; another replica resolves meanwhile."""
        from sandboxes.sessions.store import binding_key, lock_key

        assert self.redis is not None
        console, key = fleet.console, f"lease-{self.run_id}"
        redis = self.redis.client()
        lock, bound = lock_key(console.space_id, key), binding_key(console.space_id, key)
        with self.fault("lease-expiry", [fleet]) as info, self.on_create(console, key) as created:
            answers: dict[str, Any] = {}
            patient = self.lock_ttl_s + 60  # both answers come after the lease ran out

            def resolve_on(web: str) -> None:
                answers[web] = self.call(fleet, web, "resolve", key, timeout=patient)

            first = threading.Thread(target=resolve_on, args=("web",))
            first.start()
            # Frozen once its sandbox exists: inside the create, holding the lock, not bound.
            if not created.wait(30):
                raise RuntimeError(f"no sandbox was created for {key}")
            fleet.blocked.add("web")
            console.processes["web"].freeze()
            info["hit"] = bool(redis.exists(lock)) and not redis.exists(bound)
            second = threading.Thread(target=resolve_on, args=("web2",))
            second.start()
            time.sleep(self.lock_ttl_s + 5)  # the lease runs out; the second replica takes over
            console.processes["web"].thaw()
            fleet.blocked.discard("web")
            first.join(patient)
            second.join(patient)
            ids = {name: (body or {}).get("sandbox_id") for name, body in answers.items()}
            info["answers"] = {name: (value or "")[:12] for name, value in ids.items()}
            info["agreed"] = len(set(ids.values())) == 1 and all(ids.values())
            self.drive(fleet, [key], web="web2")  # its /workspace file, for the later checks

    @contextmanager
    def on_create(self, console: Console, key: str) -> Iterator[threading.Event]:
        """An event set the moment the engine reports a container created for session `key`.

        The engine's event stream, not polling: a create is followed within a few hundred
        milliseconds by start and bind, which a poll of the container list can miss.
        """
        labels = [f"console.meta.console-installation={console.installation_id}", f"console.meta.console-session={key}"]
        created = threading.Event()
        stream = docker_api().events(filters={"label": labels, "type": "container", "event": "create"}, decode=True)

        def watch() -> None:
            for _ in stream:
                created.set()
                return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield created
        finally:
            stream.close()

    def kill_before_bind(self, fleet: Fleet) -> None:
        """A replica killed with -9 once its new sandbox exists, before it binds it."""
        from sandboxes.sessions.store import binding_key

        assert self.redis is not None
        console, key = fleet.console, f"killed-{self.run_id}"
        redis = self.redis.client()
        bound = binding_key(console.space_id, key)
        with self.fault("kill-before-bind", [fleet]) as info, self.on_create(console, key) as created:
            fleet.blocked.add("web2")
            doomed = threading.Thread(target=lambda: self.call(fleet, "web2", "resolve", key))
            doomed.start()
            if not created.wait(30):
                raise RuntimeError(f"no sandbox was created for {key}")
            console.processes["web2"].kill()
            info["hit"] = not redis.exists(bound)
            doomed.join(REQUEST_TIMEOUT_S)
            console.start_web("web2")
            fleet.blocked.discard("web2")
            # The killed holder's lock frees itself when its lease runs out; the resolve waits.
            body = self.call(fleet, "web", "resolve", key, timeout=self.lock_ttl_s + 60)
            if body is None:
                raise RuntimeError(f"session {key} did not come back after its creator was killed")
            self.drive(fleet, [key])  # its /workspace file, for the later checks

    # The whole run ----------------------------------------------------------------------

    def run(self, only: set[str]) -> dict[str, Any]:
        traffic = threading.Thread(target=self.traffic, name="traffic", daemon=True)
        traffic.start()
        started = time.monotonic()
        try:
            if not only or only & {"restart-embedded"}:
                embedded = self.embedded()
                self.drive(embedded, ["e-0", "e-1"])
                self.drive(embedded, ["e-2", "e-3"], quiet=True)
                embedded.console.ui().session_action(embedded.console.api().session("e-3").body["id"], "pause")
                self.restart(embedded)
                embedded.blocked.update(embedded.console.processes)  # done with it: traffic elsewhere
                embedded.console.stop_all()  # and its CPU back for the scaled console
            scaled_faults = [
                ("restart-scaled", self.restart),
                ("redis-flush", self.redis_flush),
                ("redis-restart", self.redis_restart),
                ("lease-expiry", self.lease_expiry),
                ("kill-before-bind", self.kill_before_bind),
                ("postgres-restart", self.postgres_restart),
            ]
            chosen = [(name, inject) for name, inject in scaled_faults if not only or name in only]
            if chosen:
                scaled = self.scaled()
                self.drive(scaled, ["s-0", "s-1", "s-2"], web="web")
                self.drive(scaled, ["s-3", "s-4", "s-5"], web="web2", quiet=True)
                for _, inject in chosen:
                    inject(scaled)
        finally:
            self.stop_traffic.set()
            traffic.join(REQUEST_TIMEOUT_S + 5)
        return self.summary(time.monotonic() - started)

    def summary(self, seconds: float) -> dict[str, Any]:
        totals = Counter[str]()
        for tally in self.tallies.values():
            totals.update(
                requests=tally.requests,
                server_errors=tally.server_errors,
                conflicts=tally.conflicts,
                unanswered=tally.unanswered,
                store_down_503=tally.store_down_503,
            )
        lost = [item for result in self.results for item in result["lost"]]
        duplicates = [item for result in self.results for item in result["duplicates"]]
        return {
            "sessions": sum(len(fleet.sessions) for fleet in self.fleets),
            "faults": len(self.results),
            "lost": len(lost),
            "duplicates": len(duplicates),
            "server_errors": totals["server_errors"],
            "conflicts": totals["conflicts"],
            "store_down_503": totals["store_down_503"],
            "unanswered": totals["unanswered"],
            "requests": totals["requests"],
            "per_fault": {
                result["fault"]: {
                    "lost": len(result["lost"]),
                    "duplicates": len(result["duplicates"]),
                    "server_errors": result["server_errors"],
                    "conflicts": result["conflicts"],
                    **({"hit": result["hit"]} if "hit" in result else {}),
                    **({"agreed": result["agreed"]} if "agreed" in result else {}),
                }
                for result in self.results
            },
            "lost_sessions": lost,
            "seconds": round(seconds, 1),
        }

    def clean_up(self) -> None:
        for fleet in self.fleets:
            fleet.console.stop_all()
            remove_docker_leftovers(fleet.console.installation_id)
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from sandboxes.sessions.store import LOCK_TTL_MS

    parser.add_argument(
        "--lock-ttl-s",
        type=float,
        default=LOCK_TTL_MS / 1000,
        help="the lifecycle lock's lease (sandboxes/sessions/store.py)",
    )
    parser.add_argument("--only", default="", help="comma-separated fault names")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="console-faults-"))
    campaign = Campaign(workdir, args.lock_ttl_s)
    summary: dict[str, Any] = {}
    try:
        summary = campaign.run({name for name in args.only.split(",") if name})
    finally:
        campaign.clean_up()
        if args.keep:
            print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
