"""Prometheus metrics of a beat: what it claimed, sent and skipped, by job; how late its runs went
out; when each job runs next and when this instance last sent it; its backend's outages and round
trips; whether it is alive and ready.

They need the ``metrics`` extra (prometheus-client). Each beat serves them at ``/metrics`` on
``anarchon_metrics_port``, beside its probes; or mount :data:`REGISTRY` in a server of your own
(``prometheus_client.make_wsgi_app(REGISTRY)``). Labels are job names and fixed sets of outcomes,
triggers and reasons, never runs: a series per job and outcome at most. Counters count what this
instance did; sum them over the instances for the deployment (every run is won by one instance, so
``anarchon_runs_sent_total`` summed is the runs sent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import clock
from .history import decode_event

if TYPE_CHECKING:
    from .backends.base import Claim, Outcome
    from .health import Health
    from .jobs import Job
    from .sending import SendOutcome

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # the metrics extra is not installed: nothing is counted
    prometheus_client = None

__all__ = ["AVAILABLE", "LATENESS_BUCKETS", "REGISTRY", "BeatMetrics", "beat_metrics", "exposition"]

#: Whether prometheus-client is installed (the ``metrics`` extra).
AVAILABLE = prometheus_client is not None
#: The registry of this package's metrics (not prometheus-client's global one, so that an app's
#: own metrics and ours are served where each is meant to be).
REGISTRY: Any = prometheus_client.CollectorRegistry() if prometheus_client is not None else None
#: Seconds from a run's slot to its task sent: jitter (2 s by default) is a part of it.
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Seconds of one claim call to the backend (a batch of claims).
ROUND_TRIP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def exposition() -> tuple[bytes, str] | None:
    """The metrics in Prometheus' text format, with its content type; None without the extra."""
    if prometheus_client is None:
        return None
    return prometheus_client.generate_latest(REGISTRY), prometheus_client.CONTENT_TYPE_LATEST


class BeatMetrics:
    """The beat's counters, made once per process (see :func:`beat_metrics`); the scheduler tells
    it what happened. Without prometheus-client every method does nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: When this instance last sent each job's run (epoch seconds).
        self._last_sent: dict[str, float] = {}
        self._source: Callable[[], tuple[Mapping[str, Job], Health | None]] | None = None
        self._outage_since: float | None = None
        self._known: set[str] = set()  # the jobs whose watched series are made
        #: When this process began counting (a new value: its counters started again at 0).
        self.started_at = time.time()
        if prometheus_client is None:
            return
        p, r = prometheus_client, REGISTRY
        self.claims = p.Counter(
            "anarchon_claims", "Claims this instance made, by job and outcome.", ["anarchon_job", "outcome"], registry=r
        )
        self.sent = p.Counter(
            "anarchon_runs_sent",
            "Runs whose task this instance sent, by job and trigger (schedule, catch_up, buffered, takeover).",
            ["anarchon_job", "trigger"],
            registry=r,
        )
        self.send_failures = p.Counter(
            "anarchon_send_failures", "Runs won whose task could not be sent, by job.", ["anarchon_job"], registry=r
        )
        self.skipped = p.Counter(
            "anarchon_runs_skipped",
            "Runs not sent, by job and reason: too_late (found past max_late_ms by this instance), paused, "
            "overlap, overlap_buffer_full, catch_up_window, catch_up_cap.",
            ["anarchon_job", "reason"],
            registry=r,
        )
        self.caught_up = p.Counter(
            "anarchon_runs_caught_up", "Missed runs a catch-up run stood for, by job.", ["anarchon_job"], registry=r
        )
        self.hand_backs = p.Counter(
            "anarchon_runs_handed_back",
            "Runs won whose lease this instance handed back to their backups (a failed send, a stop).",
            registry=r,
        )
        self.lateness = p.Histogram(
            "anarchon_lateness_seconds",
            "From a run's slot to its task sent, by job (jitter included).",
            ["anarchon_job"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.round_trips = p.Histogram(
            "anarchon_backend_round_trip_seconds",
            "One claim call to the backend (a batch of claims).",
            buckets=ROUND_TRIP_BUCKETS,
            registry=r,
        )
        self.outages = p.Counter("anarchon_outages", "Outages of the backend this instance went through.", registry=r)
        self.outage_seconds = p.Counter(
            "anarchon_outage_seconds", "Seconds this instance spent with its backend not answering.", registry=r
        )
        r.register(_Live(self))

    def attach(self, source: Callable[[], tuple[Mapping[str, Job], Health | None]]) -> None:
        """Read the jobs and the health from ``source`` at each scrape (the scheduler's)."""
        self._source = source
        self.known(source()[0])

    def known(self, jobs: Iterable[str]) -> None:
        """Make the series the alerts watch, at 0, for jobs not seen yet: a counter that first
        appears at 1 shows Prometheus no increase, and its first event would alert nobody."""
        if prometheus_client is None:
            return
        with self._lock:
            new = set(jobs) - self._known
            self._known |= new
        for job in new:
            self.sent.labels(job, "takeover")
            self.send_failures.labels(job)
            self.skipped.labels(job, "too_late")

    # -- told by the scheduler ------------------------------------------------------------------

    def claimed(self, claims: Sequence[Claim], outcomes: Sequence[Outcome]) -> None:
        if prometheus_client is None:
            return
        for claim, outcome in zip(claims, outcomes):
            self.claims.labels(claim.job, outcome.value).inc()

    def too_late(self, job: str) -> None:
        if prometheus_client is not None:
            self.skipped.labels(job, "too_late").inc()

    def timed(self, seconds: float) -> None:
        if prometheus_client is not None:
            self.round_trips.observe(seconds)

    def sends(self, done: Sequence[SendOutcome]) -> None:
        if prometheus_client is None:
            return
        for outcome in done:
            run = outcome.run
            job = run.job.name
            if outcome.error is not None:
                self.send_failures.labels(job).inc()
                continue
            self.sent.labels(job, "takeover" if run.token > 1 else run.trigger).inc()
            self.lateness.labels(job).observe(max(0.0, (outcome.at_ms - run.slot) / 1000))
            if run.coalesced:
                self.caught_up.labels(job).inc(run.coalesced)
            with self._lock:  # (the sends of a batch end in any order)
                self._last_sent[job] = max(self._last_sent.get(job, 0.0), outcome.at_ms / 1000)

    def events(self, events: Sequence[tuple[str, bytes, int]]) -> None:
        """The history events this instance records (job, event, size): runs skipped and paused."""
        if prometheus_client is None:
            return
        for _, body, _ in events:
            if b'"event":"paused"' not in body and b'"event":"skipped"' not in body:
                continue  # (sent and unsent are counted from the sends)
            event = decode_event(body)
            if event is None:
                continue
            if event.get("event") == "paused":
                self.skipped.labels(event["job"], "paused").inc()
            elif event.get("event") == "skipped":
                self.skipped.labels(event["job"], event.get("reason", "")).inc(int(event.get("count") or 1))

    def handed_back(self, count: int) -> None:
        if prometheus_client is not None and count:
            self.hand_backs.inc(count)

    def outage(self, now_away: bool) -> None:
        """Called at each turn of the loop with whether the backend is in an outage."""
        if prometheus_client is None:
            return
        now = time.monotonic()
        with self._lock:
            since = self._outage_since
            if now_away:
                if since is None:
                    self.outages.inc()
                else:
                    self.outage_seconds.inc(now - since)
                self._outage_since = now
            elif since is not None:
                self.outage_seconds.inc(now - since)
                self._outage_since = None

    def last_sent(self) -> dict[str, float]:
        with self._lock:
            return dict(self._last_sent)


#: How far back a job's previous run is looked for (a schedule with none in this long: its next
#: two runs give its period).
PREVIOUS_HORIZON_MS = 400 * 86_400_000


class _Live:
    """What is read at each scrape: each job's next run and last send, and the probes' answers."""

    def __init__(self, metrics: BeatMetrics) -> None:
        self.metrics = metrics
        #: Each job's next slot as last worked out, with the job it was worked out for: a cron's
        #: next slot takes tens of microseconds, and a scrape must not hold the loop up (the GIL)
        #: for every job each time.
        self._next: dict[str, tuple[Job, int, int]] = {}
        self._lock = threading.Lock()  # (scrapes may come at once)

    def _next_slots(self, name: str, job: Job, now: int) -> tuple[int, int]:
        """The job's next slot after ``now``, and the time from its previous one to it: the
        period the job is in now (a cron at 9:00 on weekdays: 3 days over a weekend)."""
        known = self._next.get(name)
        if known is not None and known[0] is job and known[1] > now:
            return known[1], known[2]
        slot = job.next_slot(now)
        previous = job.schedule.last_slot(now - PREVIOUS_HORIZON_MS, now + 1)
        period = slot - previous if previous is not None else job.next_slot(slot) - slot
        self._next[name] = (job, slot, period)
        return slot, period

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        source = self.metrics._source  # noqa: SLF001 - its own companion
        if source is None:
            return
        jobs, health = source()
        self.metrics.known(jobs)  # (runtime jobs added since)
        now = clock.now_ms()
        nxt = GaugeMetricFamily(
            "anarchon_next_run_timestamp_seconds", "When each job's next run is due.", labels=["anarchon_job"]
        )
        period = GaugeMetricFamily(
            "anarchon_job_period_seconds",
            "The period each job is in: from its previous run to its next (what an alert on a job not run for "
            "two periods reads).",
            labels=["anarchon_job"],
        )
        with self._lock:
            for name, job in sorted(jobs.items()):
                slot, period_ms = self._next_slots(name, job, now)
                nxt.add_metric([name], slot / 1000)
                period.add_metric([name], period_ms / 1000)
            for gone in self._next.keys() - jobs.keys():
                del self._next[gone]
        yield nxt
        yield period
        sent = GaugeMetricFamily(
            "anarchon_last_sent_timestamp_seconds",
            "When this instance last sent a run of each job.",
            labels=["anarchon_job"],
        )
        for name, at in sorted(self.metrics.last_sent().items()):
            sent.add_metric([name], at)
        yield sent
        yield GaugeMetricFamily("anarchon_jobs", "The jobs this instance runs (code and runtime).", value=len(jobs))
        yield GaugeMetricFamily(
            "anarchon_started_timestamp_seconds",
            "When this instance started (its counters started at 0 then).",
            value=self.metrics.started_at,
        )
        if health is not None:
            yield GaugeMetricFamily("anarchon_alive", "1 while the scheduler loop moves.", value=int(health.live))
            yield GaugeMetricFamily("anarchon_ready", "1 while alive and claiming.", value=int(health.ready))


_MADE: BeatMetrics | None = None
_MADE_LOCK = threading.Lock()


def beat_metrics() -> BeatMetrics:
    """This process's :class:`BeatMetrics` (Prometheus metrics are registered once per process)."""
    global _MADE
    with _MADE_LOCK:
        if _MADE is None:
            _MADE = BeatMetrics()
        return _MADE
