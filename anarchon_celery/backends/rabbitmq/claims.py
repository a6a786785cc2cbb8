"""The claim: one persistent message published into each run's gate on a confirm channel. The
broker acks the publish that filled the gate and nacks every later one, so exactly one instance
gets the ack. Anything else (a connection lost before the answer, a confirm that never comes, a
claim returned as unroutable) is *not* a win: the run is skipped rather than risk running it twice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import amqp

from ... import clock
from ...confirms import ConfirmTracker, publish
from ..base import Claim, Outcome
from .ahead import DeclaresAhead
from .link import Link
from .names import gate_name

logger = logging.getLogger(__name__)

#: Seconds after which a gate found away is forgotten (its run is long past its deadline).
AWAY_FORGOTTEN_S = 3600.0


class Confirms:
    """A confirm-mode channel and the answers to the claims published on it.

    Answers are matched by delivery tag (:class:`~anarchon_celery.confirms.ConfirmTracker`); a
    ``basic.return`` (which RabbitMQ sends before the ack of the same message) is matched by
    routing key, the gate's name, which is unique per claim.
    """

    def __init__(self, connection: amqp.Connection) -> None:
        self.channel = connection.channel()
        self.channel.confirm_select()
        self.tracker: ConfirmTracker[str] = ConfirmTracker(self._answered)
        self.tracker.listen(self.channel)
        self.answers: dict[str, Outcome] = {}
        self.returned: set[str] = set()
        self.won: list[str] = []  # gates answered WON since the caller last took them
        self.dead = False
        self.channel.events["basic_return"].add(self._on_return)

    def publish(self, gate: str, body: bytes) -> None:
        message = amqp.Message(body, delivery_mode=2, content_type="application/json")
        self.tracker.writing(gate)  # the broker numbers every publish on the channel, even a failed one
        publish(self.channel, message, exchange="", routing_key=gate, mandatory=True)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        if not self.dead:
            self.returned.add(routing_key)

    def _answered(self, gate: str, acked: bool) -> None:
        if self.dead:  # a late answer on an abandoned channel means nothing any more
            return
        if gate in self.returned:
            # Unroutable: the gate vanished between declare and publish. The broker acks a
            # returned message, but nothing holds the gate: not a win.
            self.returned.discard(gate)
            self.answers[gate] = Outcome.UNDECIDED
        elif acked:
            self.answers[gate] = Outcome.WON
            self.won.append(gate)
        else:
            self.answers[gate] = Outcome.LOST


class Claimer:
    """Claims runs through ``link``, declaring their gates with ``declare_gates`` unless
    ``ahead`` has them declared already."""

    def __init__(
        self,
        link: Link,
        prefix: str,
        ahead: DeclaresAhead,
        declare_gates: Callable[[list[str]], list[Outcome | None]],
        gates_away: Callable[[list[str]], set[str]],
        declare_away: Callable[[list[str]], list[Outcome | None]],
    ) -> None:
        self.link = link
        self.prefix = prefix
        self.ahead = ahead
        self.declare_gates = declare_gates
        self.gates_away = gates_away
        self.declare_away = declare_away
        #: Gates found away (their node down), and when: their runs' claims, made again, only
        #: probe them briefly, so that a gate still away holds up no other run.
        self.away: dict[str, float] = {}
        #: How many times a claim left without an answer is made again (see :meth:`claim`).
        self.retries = 2
        self._confirms: Confirms | None = None
        link.on_discard(self._forget)

    def _forget(self) -> None:
        if self._confirms is not None:
            self._confirms.dead = True
        self._confirms = None

    def claim(
        self, claims: Sequence[Claim], instance: str, *, on_won: Callable[[Claim], None] | None = None
    ) -> list[Outcome]:
        """See :meth:`RabbitMQBackend.claim`."""
        self.ahead.collect()  # the gates declared ahead meanwhile are not declared again
        outcomes: dict[str, Outcome] = {}
        pending = [(claim, gate_name(self.prefix, claim.job, claim.slot)) for claim in claims]
        for attempt in range(1 + self.retries):
            unanswered = self._claim_once(pending, instance, outcomes, last=attempt == self.retries, on_won=on_won)
            pending = [(c, g) for c, g in pending if g in unanswered]
            if not pending:
                break
        now = time.monotonic()
        for gate, outcome in outcomes.items():
            if outcome is Outcome.AWAY:
                self.away.setdefault(gate, now)
            else:
                self.away.pop(gate, None)
        for gate in [g for g, since in self.away.items() if now - since > AWAY_FORGOTTEN_S]:
            del self.away[gate]  # its run's deadline is long past
        return [outcomes[gate_name(self.prefix, c.job, c.slot)] for c in claims]

    def _claim_once(
        self,
        claims: list[tuple[Claim, str]],
        instance: str,
        outcomes: dict[str, Outcome],
        *,
        last: bool,
        on_won: Callable[[Claim], None] | None = None,
    ) -> set[str]:
        """One round of :meth:`claim`; returns the gates whose claim may be made again."""
        claims = _within_deadline(claims, outcomes, "before connecting")
        if not claims:
            return set()
        declared = self._declare(claims, outcomes)
        if declared is None:
            return set()
        raw, verdicts = declared
        gated = []
        for (claim, gate), verdict in zip(claims, verdicts):
            if verdict is None:
                gated.append((claim, gate))
            else:
                outcomes[gate] = verdict
        to_publish = _within_deadline(gated, outcomes, "when the claim was ready")
        if not to_publish:
            return set()
        unanswered, returned = self._publish(raw, to_publish, instance, outcomes, last=last, on_won=on_won)
        self._find_away([gate for _, gate in to_publish], outcomes, returned)
        for claim, gate in to_publish:
            if gate in returned and outcomes[gate] is Outcome.UNDECIDED:
                logger.warning(
                    "anarchon: job %r slot %d: the claim was returned as unroutable (its gate vanished); "
                    "not run by this instance",
                    claim.job,
                    claim.slot,
                )
        return unanswered

    def _declare(
        self, claims: list[tuple[Claim, str]], outcomes: dict[str, Outcome]
    ) -> tuple[amqp.Connection, list[Outcome | None]] | None:
        """Connect and declare the claims' gates (those not declared ahead); returns the
        connection and, per claim, None (its gate is ready) or the outcome it already has. None
        when RabbitMQ could not be reached: every claim is then UNDECIDED."""
        just_claims = [claim for claim, _ in claims]
        ready = self.ahead.ready
        # Nothing is published before the gates are declared, so this part is safe to repeat: a
        # connection found dead (the broker restarted, or dropped it while we slept) is replaced
        # at once, and only then is the outage reported.
        for attempt in (1, 2):
            try:
                raw = self.link.connect(_seconds_until(just_claims))
                # Gates made ahead by prepare() are not declared again: at the slot, only the claim.
                undeclared = [gate for _, gate in claims if gate not in ready and gate not in self.away]
                declared = dict(zip(undeclared, self.declare_gates(undeclared)))
                known_away = [gate for _, gate in claims if gate in self.away and gate not in ready]
                if known_away:  # after the others: those are not held up by them
                    declared.update(zip(known_away, self.declare_away(known_away)))
                for _, gate in claims:
                    ready.pop(gate, None)
                return raw, [declared.get(gate) for _, gate in claims]
            except self.link.errors() as exc:
                self.link.discard(connection_lost=True)
                left = _seconds_until(just_claims)
                if attempt == 2 or (left is not None and left <= 0):
                    self._unavailable(claims, exc, outcomes)
                    return None
                logger.info("anarchon: reconnecting to RabbitMQ (%s: %s)", type(exc).__name__, exc)
        return None

    def _unavailable(self, claims: list[tuple[Claim, str]], exc: BaseException, outcomes: dict[str, Outcome]) -> None:
        """RabbitMQ could not be reached for ``claims``: an outage, in which they are missed."""
        self.link.outage(exc)
        for claim, gate in claims:
            self.link.missed(claim.job, [claim.slot])  # reported once, when the outage ends
            logger.debug(
                "anarchon: job %r slot %d: not claimed, RabbitMQ is unavailable; not run by this instance",
                claim.job,
                claim.slot,
            )
            outcomes[gate] = Outcome.UNDECIDED

    def _find_away(self, published: list[str], outcomes: dict[str, Outcome], returned: set[str]) -> None:
        """Turn the claims turned down because their gate's node went away into ``AWAY``, where a
        passive declare of the gate finds its node down: RabbitMQ 4 nacks a claim into a down
        node's gate and 3.x returns it, as if another instance held the run or the gate had
        expired. A gate declared ahead was last seen alive long before; one declared by this
        very claim may have gone between its declare-ok and the claim (a node stopped). The
        probes are pipelined: one more round trip for the batch's losers, after the wins are
        reported. With one node, a gate cannot be away while the connection to it lives:
        nothing to do."""
        if not self.link.several_nodes:
            return
        suspects = [
            g
            for g in published
            if outcomes.get(g) is Outcome.LOST or (g in returned and outcomes.get(g) is Outcome.UNDECIDED)
        ]
        if not suspects:
            return
        try:
            away = self.gates_away(suspects)
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            logger.info("anarchon: could not tell a lost claim from a gate away (%s: %s)", type(exc).__name__, exc)
            return
        for gate in away:
            outcomes[gate] = Outcome.AWAY

    def _publish(
        self,
        raw: amqp.Connection,
        claims: list[tuple[Claim, str]],
        instance: str,
        outcomes: dict[str, Outcome],
        *,
        last: bool,
        on_won: Callable[[Claim], None] | None = None,
    ) -> tuple[set[str], set[str]]:
        """Publish the claims and wait for their answers; returns the gates left unanswered (when
        they may be claimed again) and those whose claim was returned.
        ``on_won`` hears of each win as its answer is read (outside py-amqp's event dispatch)."""
        confirms = self._confirms
        failure: BaseException | None = None
        by_gate = {gate: claim for claim, gate in claims}

        def report_wins() -> float:
            """Tell ``on_won`` of the wins read; returns the seconds that took."""
            if confirms is None or not confirms.won:
                return 0.0
            started = time.monotonic()
            gates, confirms.won = confirms.won, []
            for claim in filter(None, map(by_gate.get, gates)):
                if on_won is None:
                    break
                try:
                    on_won(claim)
                except Exception:  # not the broker's doing: the claim is won all the same
                    logger.exception("anarchon: job %r slot %d: on_won failed", claim.job, claim.slot)
            return time.monotonic() - started

        try:
            if confirms is None:
                confirms = self._confirms = Confirms(raw)
            now_ms = clock.now_ms()
            for claim, gate in claims:
                confirms.publish(gate, _claim_body(claim, instance, now_ms))
            # The time on_won takes (writing tasks) is ours, not the broker's: it does not count
            # against confirm_timeout, or answers already here would be taken for lost.
            confirms.tracker.wait(
                lambda left: raw.drain_events(timeout=left), self.link.confirm_timeout, ours=report_wins
            )
        except self.link.errors() as exc:
            # Never reuse this channel (a late ack on it could pass for a later win), nor, when
            # it is ours, this connection.
            self.link.discard(connection_lost=not isinstance(exc, TimeoutError))
            failure = exc
        report_wins()  # answers read before a failure are still wins
        return _sort_answers(claims, confirms.answers if confirms is not None else {}, outcomes, failure, last)


def _claim_body(claim: Claim, instance: str, now_ms: int) -> bytes:
    return json.dumps({"job": claim.job, "slot": claim.slot, "instance": instance, "claimed_at_ms": now_ms}).encode()


def _sort_answers(
    claims: list[tuple[Claim, str]],
    answers: dict[str, Outcome],
    outcomes: dict[str, Outcome],
    failure: BaseException | None,
    last: bool,
) -> tuple[set[str], set[str]]:
    """Take the claims' answers into ``outcomes``; returns the gates left unanswered (to claim
    again, unless this was the ``last`` round) and those whose claim was returned."""
    unanswered = set()
    returned = set()
    for claim, gate in claims:
        outcome = answers.pop(gate, None)
        if outcome is None:  # no answer: try again (see claim()) or give up
            outcomes[gate] = Outcome.UNDECIDED
            unanswered.add(gate)
            logger.warning(
                "anarchon: job %r slot %d: no answer to the claim (%s: %s); %s",
                claim.job,
                claim.slot,
                type(failure).__name__,
                failure,
                "not run by this instance" if last else "claiming it again on a new connection",
            )
        else:
            outcomes[gate] = outcome
            if outcome is Outcome.UNDECIDED:
                returned.add(gate)
    return (set() if last else unanswered), returned


def _within_deadline(
    claims: list[tuple[Claim, str]], outcomes: dict[str, Outcome], when: str
) -> list[tuple[Claim, str]]:
    """The claims still before their deadline; the others are given up (UNDECIDED), since a claim
    published after it could land once the winner's gate has expired."""
    now = clock.now_ms()
    kept = []
    for claim, gate in claims:
        if claim.deadline_ms is not None and now > claim.deadline_ms:
            logger.warning(
                "anarchon: job %r slot %d: past its deadline by %d ms %s; not run by this instance",
                claim.job,
                claim.slot,
                now - claim.deadline_ms,
                when,
            )
            outcomes[gate] = Outcome.UNDECIDED
        else:
            kept.append((claim, gate))
    return kept


def _seconds_until(claims: Sequence[Claim]) -> float | None:
    """Seconds left before the earliest deadline of the claims (None: no deadline)."""
    deadlines = [c.deadline_ms for c in claims if c.deadline_ms is not None]
    return (min(deadlines) - clock.now_ms()) / 1000 if deadlines else None
