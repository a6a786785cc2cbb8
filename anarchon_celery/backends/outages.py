"""A store's outages, as the calls of one instance meet them (a part of
:class:`~.store.StoreBackend`): when the store stopped answering, which is when the first call it
has not answered since its last answer was made, not when that call gave up (after the store's
``timeout``, maybe twice: once more on a new connection); the lines that say an outage started,
goes on and ended; and how long the call waiting now has waited, which readiness reads
(:meth:`~.base.Backend.unanswered_s`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence

__all__ = ["MissedRuns", "Outages"]

logger = logging.getLogger(__name__)

#: A store that answers a call (or the next one, on a new connection) only after this many seconds
#: is said to have answered late, in a warning (readiness turned at :data:`~..health.UNANSWERED_S`).
LATE_ANSWER_S = 2.0


class MissedRuns:
    """The runs the scheduler gave up during an outage (their deadline passed), for the line that
    says it ended: all counted, the first :attr:`named` named by job and slot."""

    named = 20

    def __init__(self) -> None:
        self.count = 0
        self._slots: dict[str, list[int]] = {}

    def add(self, job: str, slots: Sequence[int]) -> None:
        self.count += len(slots)
        room = self.named - sum(len(kept) for kept in self._slots.values())
        if room > 0 and slots:
            self._slots.setdefault(job, []).extend(slots[:room])

    def __str__(self) -> str:
        """``N run(s) were not claimed meanwhile``, then the runs: ``: job 'a' slots 1, 2; ...``."""
        text = f"{self.count} run(s) were not claimed meanwhile"
        if not self.count:
            return text
        jobs = "; ".join(
            f"job {job!r} slot{'s' if len(slots) > 1 else ''} {', '.join(str(slot) for slot in slots)}"
            for job, slots in self._slots.items()
        )
        shown = sum(len(slots) for slots in self._slots.values())
        return f"{text} (their deadline passed): {jobs}" + (
            f" and {self.count - shown} more" if self.count > shown else ""
        )


class Outages:
    """The outages of the store that ``describe()`` names (never with a password)."""

    def __init__(
        self,
        describe: Callable[[], str],
        errors: Callable[[], tuple[type[BaseException], ...]],
        reminder_s: Callable[[], float],
    ) -> None:
        self._describe = describe
        self._errors = errors  # the store's: unreachable, refused, or its answer lost (known once it is made)
        self._reminder_s = reminder_s
        self.since: float | None = None  # time.monotonic() of its first unanswered call
        self._reminded = 0.0  # time.monotonic() of its last line
        self._unanswered_since: float | None = None
        self._claims_failing = False  # a claim failed in this outage: only a claim answered ends it
        self.missed = MissedRuns()

    @contextlib.contextmanager
    def asking(self, what: str | None = None) -> Iterator[None]:
        """Around one call of the store: from its start, the store owes an answer (unless an
        earlier call is still unanswered: that one counts); answered when it returns.

        With ``what`` (what the call does, for the outage's line), the call is one of the loop's
        own (a look for changes, the instances' announcements): one of the store's errors after
        :data:`LATE_ANSWER_S` without an answer starts an outage (a frozen store: the call waited
        for the store's timeout), or goes on with it; a quicker one (a connection reset once) is
        the caller's to log. Its answer ends an outage that no claim failed in (a store that
        answers reads but refuses claims, a read-only replica, stays in its outage). Without
        ``what``, the caller says (a claim, made once more on a new connection first; history,
        written by workers too). The error is raised as it is."""
        if self._unanswered_since is None:
            self._unanswered_since = time.monotonic()
        try:
            yield
        except self._errors() as exc:
            if what is not None and (self.since is not None or self.unanswered_s() >= LATE_ANSWER_S):
                self.failed(what, exc)
            raise
        waited = time.monotonic() - self._unanswered_since
        self._unanswered_since = None
        if self.since is not None:
            if not self._claims_failing:
                self.recovered()
            return
        if waited > LATE_ANSWER_S:  # (an outage says how long it lasted)
            logger.warning(
                "anarchon: %s answered after %.1fs without an answer; the runs due meanwhile were claimed late",
                self._describe(),
                waited,
            )

    def unanswered_s(self) -> float:
        """Seconds since the first call the store has not answered (0 when it answered the last)."""
        since = self._unanswered_since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    def failed(self, what: str, exc: BaseException, *, claims: bool = False) -> None:
        """A call failed (``claims``: a claim, or a takeover): an outage starts (logged, counted
        from its first unanswered call), or goes on (a reminder every ``reminder_s()``)."""
        self._claims_failing = self._claims_failing or claims
        reminder_s = self._reminder_s()
        now = time.monotonic()
        if self.since is None:
            self.since = self._unanswered_since if self._unanswered_since is not None else now
            self._reminded = now
            logger.error(
                "anarchon: %s cannot %s (%s: %s); no answer for %.1fs, runs due meanwhile are claimed again "
                "until their deadline",
                self._describe(),
                what,
                type(exc).__name__,
                exc,
                now - self.since,
            )
        elif now - self._reminded >= reminder_s:
            self._reminded = now
            logger.warning(
                "anarchon: %s still cannot %s after %.0fs (%s: %s); %d run(s) not claimed so far",
                self._describe(),
                what,
                now - self.since,
                type(exc).__name__,
                exc,
                self.missed.count,
            )

    def recovered(self) -> None:
        """A call was answered: an outage, if any, ends (logged, with the runs it cost)."""
        self._unanswered_since = None
        if self.since is not None:
            logger.warning(
                "anarchon: %s is back after %.1fs; %s", self._describe(), time.monotonic() - self.since, self.missed
            )
            self.since, self.missed, self._claims_failing = None, MissedRuns(), False
