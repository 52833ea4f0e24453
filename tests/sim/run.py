"""The driver of one seed: its configuration, its actors, the choice of every step, the
quiet phase at the end, and what it found.

A seed picks a *profile* (round robin over ``PROFILES``) that biases the probabilities
of faults and events -- never a script of them -- and the number of replicas. Then, for
``steps`` steps, it lets the world settle and picks one of the possible steps at random
(weights from the profile):

* a call suspended in the model cluster proceeds (``resume``);
* a replica starts a tick (as its shard does: renew or take the lease first), runs its
  lease keeper, gives its lease up between ticks (``shed``), stalls for a while
  (``freeze``: nothing of it runs, its clocks run on), dies (``crash``: its suspended
  calls never return), or a new replica starts (``restart``);
* the client inserts a row, deletes one, deletes one and writes it again under the same
  id (``rewrite``), writes a deleted id again, or sets desired to stopped, held or run;
* the neighbour deployment (another database, the same cluster and Slurm user) inserts
  and ticks;
* the cluster starts, completes, fails or requeues a job, kills it with its node, saves
  or loses its state;
* virtual time moves a little, or past the lease's TTL.

Then the quiet phase: no faults, no client, every stalled replica awake; the cluster runs
and completes everything and the leaders tick until every job has ended as its row asks
(invariant (e)), and a few ticks more (``replan_soon`` must turn false).
"""

from __future__ import annotations

import asyncio
import random
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from tests.sim.cluster import QUIET, Cluster, Faults, SimJob
from tests.sim.invariants import QUIET_TICKS, History, Invariants, Violation
from tests.sim.sched import Scheduler, VirtualClock
from tests.sim.world import (
    BUDGET_S,
    TTL_S,
    Database,
    Replica,
    TickReport,
    new_database,
)

PROFILES = ("mixed", "stall", "rewrite", "burst", "refusals", "neighbour")
STEPS = 240
QUIET_ROUNDS = 400  # at most (about 1.5 virtual hours: the longest backoff is one hour)
MAIN, NEIGHBOUR = "main", "nb"

BASE_WEIGHTS: Mapping[str, float] = {
    "resume": 6.0, "tick": 3.0, "keep": 1.2, "shed": 0.08, "freeze": 0.08, "crash": 0.03,
    "restart": 0.3, "time": 2.0, "jump": 0.1,
    "insert": 1.5, "delete": 0.3, "rewrite": 0.2, "reinsert": 0.2, "stop": 0.4,
    "hold": 0.25, "run": 0.25, "nb_insert": 0.8,
    "start_job": 2.5, "complete": 1.5, "fail_exit": 0.08, "node_fail": 0.12,
    "preempt": 0.08, "requeue": 0.08, "save_state": 0.2, "lose_state": 0.02,
}
BASE_FAULTS = Faults(read_fail=0.03, read_slow=0.03, acct_fail=0.05, sbatch_refused=0.04,
                     sbatch_lost=0.03, ack_lost=0.04, ack_late=0.04, visible_late=0.06,
                     write_fail=0.03)


@dataclass(frozen=True)
class Config:
    """What a seed runs: drawn from the seed alone."""

    seed: int
    profile: str
    replicas: int
    neighbour: bool
    steps: int
    max_jobs: int
    faults: Faults
    weights: Mapping[str, float]

    def describe(self) -> str:
        return (f"profile {self.profile}, {self.replicas} replicas"
                + (", a neighbour deployment" if self.neighbour else "")
                + f", {self.steps} steps")


def configure(seed: int, *, steps: int | None = None) -> Config:
    """The seed's configuration: its profile (round robin) biases the probabilities."""
    rng = random.Random(f"config:{seed}")
    profile = PROFILES[seed % len(PROFILES)]
    weights = dict(BASE_WEIGHTS)
    faults = BASE_FAULTS
    replicas = 3 if rng.random() < 0.4 else 2
    neighbour = rng.random() < 0.08
    max_jobs = 24
    if profile == "stall":  # replicas stall past their TTL, shed, die; answers come late
        weights.update(freeze=2.0, jump=0.5, shed=1.2, crash=0.2, keep=3.0, restart=1.0)
        faults = replace(faults, ack_late=0.12, read_slow=0.08)
    elif profile == "rewrite":  # rows deleted and written again under the same id
        weights.update(rewrite=1.6, reinsert=0.5, delete=0.4, insert=2.0, tick=4.0)
        faults = Faults(read_fail=0.01, acct_fail=0.02, visible_late=0.03)
    elif profile == "burst":  # rows keep arriving while every read outlasts the budget
        weights.update(insert=3.0, stop=0.8, hold=0.1, run=0.1, delete=0.1, rewrite=0.0,
                       reinsert=0.0, keep=2.5, freeze=0.0, crash=0.0, shed=0.0, jump=0.0,
                       fail_exit=0.0, node_fail=0.0, preempt=0.0, requeue=0.0,
                       lose_state=0.0)
        # every read outlasts the tick's budget (a third of the lease TTL)
        faults = Faults(read_slow=1.0, read_slow_s=(BUDGET_S + 1.0, BUDGET_S + 6.0))
        replicas, max_jobs = (2 if rng.random() < 0.5 else 1), 90
    elif profile == "refusals":  # sbatch refused for a limit while rows go away
        weights.update(delete=1.0, rewrite=0.3, stop=0.8)
        faults = replace(faults, sbatch_refused=0.4)
    elif profile == "neighbour":
        neighbour = True
    return Config(seed, profile, replicas, neighbour, STEPS if steps is None else steps,
                  max_jobs, faults, weights)


_ULID_RE = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_ulid(rng: random.Random, ms: int) -> str:
    """A ULID from the seed's generator: the time part from virtual time."""
    value = (ms << 80) | rng.getrandbits(80)
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


@dataclass
class Result:
    """What one seed found."""

    config: Config
    violations: list[Violation]
    trace: list[str]
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self, replay: str, *, tail: int = 30, about: int = 40) -> str:
        """The first violation (its rule and text on the first line), the command that
        replays the seed, the steps that name what it names, and the last steps."""
        first = self.violations[0]
        lines = [f"({first.rule}) {first.text}",
                 f"seed {self.config.seed} ({self.config.describe()}), at t={first.t:.1f}"]
        lines += [f"also ({v.rule}) {v.text}" for v in self.violations[1:4]]
        lines.append(f"replay: {replay}")
        names = _named(first.text)
        if names:
            hits = [n for n, line in enumerate(self.trace) if names.search(line)]
            # with the ticks and reads in between (when they fit): what was read when
            named = set(hits)
            shown = [n for n in range(hits[0], hits[-1] + 1) if n in named
                     or _CONTEXT.search(self.trace[n])] if hits else []
            if len(shown) > about:
                shown = hits
            lines.append(f"{min(about, len(shown))} of the {len(shown)} steps about "
                         f"{names.pattern.replace(chr(92) + 'b', '')} (the first and the last):")
            mentions = [self.trace[n] for n in shown]
            if len(mentions) > about:  # how it began, and how it ended
                mentions = [*mentions[:8], "...", *mentions[8 - about:]]
            lines += ["  " + line for line in mentions]
        lines.append(f"the last {min(tail, len(self.trace))} of {len(self.trace)} steps:")
        lines += ["  " + line for line in self.trace[-tail:]]
        return "\n".join(lines)


_CONTEXT = re.compile(r"tick begins|squeue snapshot")


def _named(text: str) -> re.Pattern[str] | None:
    """A pattern for the jobs and Slurm jobs a violation names (else its replicas)."""
    words = dict.fromkeys(re.findall(r"\b[JN]\d+\b", text))
    words.update(dict.fromkeys(f"(?:job|release|scancel|hold) {n}" for n in
                               re.findall(r"Slurm jobs? \[?'?(\d+)", text)))
    if not words:
        words = dict.fromkeys(re.findall(r"\b(?:main|nb)/r\d+\b", text))
    if not words:
        return None
    return re.compile("|".join(rf"\b{w}\b" for w in words))


Action = tuple[float, str, Callable[[], None]]


class Simulation:
    """One seed's world and its driver (module docstring)."""

    def __init__(self, config: Config, where: Path, clock: VirtualClock) -> None:
        self.config = config
        self.clock = clock
        self.sched = Scheduler(clock)
        self.rng = random.Random(f"steps:{config.seed}")
        self.ids = random.Random(f"ids:{config.seed}")
        self.cluster = Cluster(self.sched, clock, random.Random(f"faults:{config.seed}"),
                               config.faults)
        self.history = History()
        self.aliases: dict[str, str] = {}
        self.databases = {MAIN: Database(MAIN, new_database(where / "main.db"), clock)}
        if config.neighbour:
            self.databases[NEIGHBOUR] = Database(NEIGHBOUR, new_database(where / "nb.db"),
                                                 clock)
        self.inv = Invariants(self.cluster, self.databases, self.history, alias=self.alias)
        self.cluster.observer = self.inv
        self.replicas: list[Replica] = []  # alive
        self.dead: list[Replica] = []
        self.frozen: dict[str, float] = {}  # replica name -> virtual time it wakes
        self._born: dict[str, int] = {}
        for _ in range(config.replicas):
            self._spawn(MAIN)
        if config.neighbour:
            self._spawn(NEIGHBOUR)

    # ------------------------------------------------------------ names in the trace

    def alias(self, text: str) -> str:
        return _ULID_RE.sub(lambda m: self.aliases.get(m.group(0), m.group(0)), text)

    def log(self, actor: str, text: str) -> None:
        self.sched.log(actor, text)

    # ------------------------------------------------------------ replicas

    def _spawn(self, deployment: str) -> Replica:
        n = self._born[deployment] = self._born.get(deployment, 0) + 1
        replica = Replica(f"{deployment}/r{n}", self.databases[deployment], self.cluster,
                          self.clock, order=self.sched.next_seq, on_db_write=self._committed,
                          on_tick_end=self._tick_ended)
        self.replicas.append(replica)
        return replica

    def _committed(self, replica: Replica, writes: list[tuple[str, int | None]]) -> None:
        counts: dict[str, int] = {}
        for table, _ in writes:
            counts[table] = counts.get(table, 0) + 1
        self.log(replica.name, "commits " + ", ".join(f"{table} x{n}" for table, n in
                                                      counts.items())
                 + f" (fenced with epoch {writes[0][1]})")
        self.inv.on_db_write(replica, writes)

    def _tick_ended(self, replica: Replica, report: TickReport | None) -> None:
        if report is None:
            self.log(replica.name, f"tick ends: {replica.ending}")
        else:
            acts = ",".join(f"{k}={v}" for k, v in sorted(report.actions.items()))
            self.log(replica.name, f"tick ends: planned {report.planned}, deferred "
                                   f"{report.deferred}, actions [{acts}]"
                                   + ("" if report.slurm_ok else ", slurm unreachable")
                                   + (", replan soon" if report.replan_soon else "")
                                   + (f", errors {report.errors[:2]}" if report.errors else ""))
        self.inv.on_tick_end(replica, report)

    def _active(self, name: str) -> bool:
        return name not in self.frozen and any(r.name == name for r in self.replicas)

    def _tick(self, replica: Replica, *, quiet: bool = False) -> bool:
        """The replica's shard ticks (if it leads); whether a tick began."""
        epoch = replica.epoch
        if not replica.start_tick():
            if not quiet:
                self.log(replica.name, "tick: not the leader")
            return False
        self.inv.note_epoch(replica.deployment, replica.epoch, replica.name)
        self.inv.on_tick_begin(replica)
        self.log(replica.name, f"tick begins under epoch {replica.tick_epoch}" + (
            "" if epoch == replica.tick_epoch else " (takes the lease)" if epoch is None
            else f" (its epoch {epoch} had moved on)"))
        return True

    def _keep(self, replica: Replica) -> None:
        said = replica.keep()
        self.inv.note_epoch(replica.deployment, replica.epoch, replica.name)
        if said:
            self.log(replica.name, f"keeper {said}")

    def _shed(self, replica: Replica) -> None:
        self.log(replica.name, f"sheds the lease (epoch {replica.epoch})")
        replica.shed()

    def _freeze(self, replica: Replica) -> None:
        until = self.clock.t + self.rng.uniform(TTL_S + 5, 3 * TTL_S)
        self.frozen[replica.name] = until
        self.log(replica.name, f"stalls until t={until:.1f}")

    def _crash(self, replica: Replica) -> None:
        self.replicas.remove(replica)
        self.dead.append(replica)
        self.frozen.pop(replica.name, None)
        self.log(replica.name, "dies")

    def _restart(self, deployment: str) -> None:
        replica = self._spawn(deployment)
        self.log(replica.name, "starts")

    def _thaw(self) -> None:
        for name, until in sorted(self.frozen.items()):
            if until <= self.clock.t:
                del self.frozen[name]
                self.log(name, "wakes up")

    # ------------------------------------------------------------ clients

    def _insert(self, deployment: str, *, job_id: str | None = None,
                desired: str | None = None) -> None:
        db = self.databases[deployment]
        if job_id is None:
            job_id = new_ulid(self.ids, int(self.clock.wall() * 1000))
            prefix = "J" if deployment == MAIN else "N"
            self.aliases[job_id] = f"{prefix}{len(self.aliases) + 1}"
        if desired is None:
            desired = self.rng.choices(("run", "held", "stopped"), (0.86, 0.1, 0.04))[0]
        db.insert(job_id, desired=desired)
        self.history.inserted.setdefault((deployment, job_id), []).append(
            self.sched.next_seq())
        if desired == "stopped":
            self.history.stopped.add((deployment, job_id))
        self.log(f"client:{deployment}", f"inserts {job_id} desired {desired}")

    def _pick(self, deployment: str, *, recent: bool = False) -> str | None:
        rows = list(self.databases[deployment].rows())
        if recent:  # the rows written last (aliases keep the order of insertion)
            order = {job_id: n for n, job_id in enumerate(self.aliases)}
            rows = sorted(rows, key=lambda job_id: order.get(job_id, 0))[-3:]
        return self.rng.choice(rows) if rows else None

    def _delete(self, deployment: str) -> None:
        job_id = self._pick(deployment)
        if job_id is not None and self.databases[deployment].delete(job_id):
            self.history.deleted.setdefault((deployment, job_id), []).append(
                self.sched.next_seq())
            self.log(f"client:{deployment}", f"deletes {job_id}")

    def _rewrite(self, deployment: str) -> None:
        job_id = self._pick(deployment, recent=self.config.profile == "rewrite")
        if job_id is not None and self.databases[deployment].delete(job_id):
            self.history.deleted.setdefault((deployment, job_id), []).append(
                self.sched.next_seq())
            self.log(f"client:{deployment}", f"deletes {job_id} and writes it again")
            self._insert(deployment, job_id=job_id, desired="run")

    def _reinsert(self, deployment: str) -> None:
        rows = self.databases[deployment].rows()
        gone = [job_id for (dep, job_id) in self.history.deleted
                if dep == deployment and job_id not in rows]
        if gone:
            self._insert(deployment, job_id=self.rng.choice(gone), desired="run")

    def _desire(self, deployment: str, desired: str) -> None:
        job_id = self._pick(deployment)
        if job_id is not None and self.databases[deployment].set_desired(job_id, desired):
            if desired == "stopped":
                self.history.stopped.add((deployment, job_id))
            self.log(f"client:{deployment}", f"sets {job_id} desired {desired}")

    # ------------------------------------------------------------ the cluster

    def _cluster_event(self, what: str, jobs: list[SimJob]) -> None:
        job = self.rng.choice(jobs)
        c = self.cluster
        if what == "start_job":
            c.run(job)
            return
        if what == "requeue":
            c.requeue(job)
            return
        state, code = {"complete": ("COMPLETED", 0), "fail_exit": ("FAILED", 1),
                       "node_fail": ("NODE_FAIL", None), "preempt": ("PREEMPTED", None)}[what]
        c.end(job, state, exit_code=code)
        self.log("slurm", f"job {job.slurm_id} ({job.name}) ends {state}")

    # ------------------------------------------------------------ the steps

    def _options(self) -> list[Action]:
        w = self.config.weights
        out: list[Action] = [(w["resume"], f"{p.actor} proceeds: {p.label}",
                              partial(self.sched.resume, p))
                             for p in self.sched.points if self._active(p.actor)]
        for r in self.replicas:
            if r.name in self.frozen:
                continue
            boost = 3.0 if r.last is not None and r.last.replan_soon else 1.0
            if not r.ticking:
                out.append((w["tick"] * boost, "", partial(self._tick_step, r)))
                if r.lease.held and r.deployment == MAIN:
                    out.append((w["shed"], "", partial(self._shed, r)))
            out.append((w["keep"], "", partial(self._keep, r)))
            if r.deployment == MAIN:
                out.append((w["freeze"], "", partial(self._freeze, r)))
                out.append((w["crash"], "", partial(self._crash, r)))
        if len([r for r in self.replicas if r.deployment == MAIN]) < self.config.replicas:
            out.append((w["restart"], "", partial(self._restart, MAIN)))
        out.append((w["time"], "time passes", partial(self._advance, 1.0, 5.0)))
        out.append((w["jump"], "time jumps past the TTL", partial(self._advance, TTL_S,
                                                                  2 * TTL_S)))
        known = sum(1 for dep, _ in self.history.inserted if dep == MAIN)
        if known < self.config.max_jobs:
            out.append((w["insert"], "", partial(self._insert, MAIN)))
        out += [(w["delete"], "", partial(self._delete, MAIN)),
                (w["rewrite"], "", partial(self._rewrite, MAIN)),
                (w["reinsert"], "", partial(self._reinsert, MAIN)),
                (w["stop"], "", partial(self._desire, MAIN, "stopped")),
                (w["hold"], "", partial(self._desire, MAIN, "held")),
                (w["run"], "", partial(self._desire, MAIN, "run"))]
        if NEIGHBOUR in self.databases and sum(
                1 for dep, _ in self.history.inserted if dep == NEIGHBOUR) < 12:
            out.append((w["nb_insert"], "", partial(self._insert, NEIGHBOUR, desired="run")))
        runnable, running = self.cluster.runnable(), self.cluster.running()
        if runnable:
            out.append((w["start_job"], "", partial(self._cluster_event, "start_job",
                                                    runnable)))
        if running:
            out += [(w[what], "", partial(self._cluster_event, what, running))
                    for what in ("complete", "fail_exit", "node_fail", "preempt", "requeue")]
        out.append((w["save_state"], "", self.cluster.save_state))
        out.append((w["lose_state"], "", self.cluster.lose_state))
        return [option for option in out if option[0] > 0]

    def _tick_step(self, replica: Replica) -> None:
        self._tick(replica)

    def _advance(self, least: float, most: float) -> None:
        self.clock.advance(self.rng.uniform(least, most))

    async def run(self) -> None:
        for _ in range(self.config.steps):
            await self.sched.settle()
            self._thaw()
            if self.inv.found:
                return
            options = self._options()
            _, label, act = self.rng.choices(options, [o[0] for o in options])[0]
            if label:
                self.log("sim", label)
            act()
        await self.sched.settle()
        if not self.inv.found:
            await self._quiet()

    # ------------------------------------------------------------ the quiet phase

    async def _drain(self) -> None:
        """Let every suspended call of the live replicas proceed, oldest first, until
        none is left."""
        for _ in range(100_000):
            await self.sched.settle()
            if self.inv.found:
                return
            points = [p for p in self.sched.points if self._active(p.actor)]
            if not points:
                return
            self.sched.resume(points[0])
        raise RuntimeError("the quiet phase never drained")

    def _signature(self) -> tuple[object, ...]:
        phases = tuple(sorted((dep, job_id, s.phase, s.slurm_id)
                              for dep, db in self.databases.items()
                              for job_id, s in db.statuses().items()))
        return (len(self.cluster.writes), len(self.cluster.executions), phases)

    async def _quiet(self) -> None:
        self.cluster.faults = QUIET
        self.log("sim", "quiet phase: no faults, no clients, every replica awake")
        for name in sorted(self.frozen):
            self.log(name, "wakes up")
        self.frozen.clear()
        for dep in self.databases:
            if not any(r.deployment == dep for r in self.replicas):
                self._restart(dep)
        settled = 0
        streak: dict[str, int] = {}
        for _ in range(QUIET_ROUNDS):
            before = self._signature()
            await self._drain()
            if self.inv.found:
                return
            now = self.cluster.now()
            for job in self.cluster.runnable():
                self.cluster.run(job)
            for job in self.cluster.running():
                if job.start is not None and job.start < now:
                    self.cluster.end(job, "COMPLETED", exit_code=0)
            for r in list(self.replicas):
                self._keep(r)
            ticked = [r for r in list(self.replicas)
                      if not r.ticking and self._tick(r, quiet=True)]
            await self._drain()
            if self.inv.found:
                return
            unsettled = [why for dep in self.databases for why in self.inv.unconverged(dep)]
            if unsettled and all(final for _, final in unsettled):
                break  # ended otherwise than asked: nothing will change that now
            if not unsettled:
                settled += 1
                for r in ticked:
                    streak[r.name] = streak.get(r.name, 0) + 1 if (
                        r.last is not None and r.last.replan_soon) else 0
                    if streak[r.name] >= QUIET_TICKS:
                        self.inv.check_replan(r, streak[r.name])
                        return
                if settled > QUIET_TICKS:
                    return
            # (under half the TTL: the keepers, run every round, keep their leases)
            self.clock.advance(5.0 if self._signature() != before else TTL_S / 2 - 1)
        for dep in self.databases:
            self.inv.check_converged(dep)

    # ------------------------------------------------------------ the end

    async def close(self) -> None:
        """Every suspended call raises ``Closing``; nothing is checked any more."""
        self.inv.found = list(self.inv.found)
        self.cluster.observer = None
        self.sched.closing = True
        for p in list(self.sched.points):
            self.sched.resume(p)
        tasks = [r.task for r in (*self.replicas, *self.dead) if r.task is not None]
        for _ in range(100):
            await asyncio.sleep(0)
            if all(t.done() for t in tasks):
                break
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def dispose(self) -> None:
        for r in (*self.replicas, *self.dead):
            r.close()
        for db in self.databases.values():
            db.close()


def run_seed(seed: int, *, steps: int | None = None) -> Result:
    """Run one seed from scratch (its own databases under /tmp, its own event loop)."""
    config = configure(seed, steps=steps)
    clock = VirtualClock()
    with tempfile.TemporaryDirectory(prefix="dispatch-sim-", dir="/tmp") as where:
        sim = Simulation(config, Path(where), clock)
        loop = asyncio.new_event_loop()
        try:
            try:
                loop.run_until_complete(sim.run())
            finally:
                found = list(sim.inv.found)
                loop.run_until_complete(sim.close())
                loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            sim.dispose()
    trace = [sim.alias(line) for line in sim.sched.trace]
    return Result(config, found, trace, dict(sim.aliases))


