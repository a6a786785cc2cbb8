"""The PostgreSQL backend against the real server: real processes racing, a commit's answer lost
with its connection, the server gone and back, another instance's lock held, its clock deciding,
what it warns of. Every row under the test's prefix is deleted afterwards."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import pytest

from anarchon_celery import Claim, ConfigError, Outcome, PostgresBackend

from .support.proxy import Proxy


def _open(url: str, prefix: str, **kwargs: Any) -> PostgresBackend:
    backend = PostgresBackend(url, prefix=prefix, **kwargs)
    backend.open()
    return backend


@pytest.fixture
def proxy(postgres_url: str) -> Any:
    parts = urlsplit(postgres_url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    yield proxy
    proxy.close()


def _through(proxy: Proxy, postgres_url: str) -> str:
    parts = urlsplit(postgres_url)
    return parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()


class _LosesTheFirstAnswer(PostgresBackend):
    """The first batch (or the first ``losses``) is committed on the server, then its connection
    goes before the answer could be read, as when a network drops the commit's reply."""

    losses = 1
    lost = 0

    def _decide(self, claims: Any, instance: str, recover: Any) -> Any:
        import psycopg

        results = super()._decide(claims, instance, recover)
        if self.lost < self.losses:
            self.lost += 1
            self._db.close()
            self._db = None
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return results


def test_a_claim_whose_commit_answer_was_lost_is_found_won_on_a_new_connection(
    postgres_url: str, postgres_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    backend = _LosesTheFirstAnswer(postgres_url, prefix=postgres_prefix)
    rival = _open(postgres_url, postgres_prefix)
    # job 1 slot 1 is the rival's already: it stays lost; the others were won by the lost commit.
    assert rival.claim([Claim("job", 1)], "b") == [Outcome.WON]
    claims = [Claim("job", 1), Claim("job", 2), Claim("other", 5)]
    assert backend.claim(claims, "a") == [Outcome.LOST, Outcome.WON, Outcome.WON]
    assert backend.lost and "claiming again on a new connection" in caplog.text
    assert rival.claim(claims, "b") == [Outcome.LOST] * 3
    assert (backend.holder("job", 2), backend.holder("other", 5)) == ("a", "a")
    backend.close()
    rival.close()


def test_a_win_whose_answer_was_lost_is_found_with_the_gap_it_left(postgres_url: str, postgres_prefix: str) -> None:
    """Catch-up: the gap a win left is kept in its record, so that a win found again after its
    answer was lost still has its runs caught up."""
    rival = _open(postgres_url, postgres_prefix)
    assert rival.claim([Claim("job", 10_000, key="k")], "b") == [Outcome.WON]
    backend = _LosesTheFirstAnswer(postgres_url, prefix=postgres_prefix)
    claim = Claim("job", 40_000, key="k")
    assert backend.claim([claim], "a") == [Outcome.WON]
    assert backend.lost and [(gap.claim, gap.after) for gap in backend.gaps()] == [(claim, 10_000)]
    backend.close()
    rival.close()


def test_a_claim_whose_answer_was_lost_every_time_is_away_and_found_won_when_made_again(
    postgres_url: str, postgres_prefix: str
) -> None:
    backend = _LosesTheFirstAnswer(postgres_url, prefix=postgres_prefix)
    backend.losses = 2  # the claim's try and its try on a new connection
    rival = _open(postgres_url, postgres_prefix)
    now = rival.store_now_ms()
    claims = [Claim("job", now - 2), Claim("job", now - 1)]
    assert backend.claim(claims, "a") == [Outcome.AWAY] * 2
    assert rival.claim(claims, "b") == [Outcome.LOST] * 2  # decided: the lost commits won them
    assert backend.claim(claims, "a") == [Outcome.WON] * 2  # made again (the scheduler's retry): its own
    assert backend.claim(claims, "a") == [Outcome.LOST] * 2  # no doubt left: a claim made twice
    backend.close()
    rival.close()


def test_postgres_gone_leaves_runs_away_and_says_when_it_is_back(
    postgres_url: str, postgres_prefix: str, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    backend = _open(_through(proxy, postgres_url), postgres_prefix, timeout=1)
    proxy.close()  # the server's port refuses connections
    assert backend.claim([Claim("job", 1), Claim("job", 2)], "a") == [Outcome.AWAY] * 2
    assert backend.in_outage()
    back = Proxy(proxy.target, port=proxy.port)
    try:
        assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]  # never decided: still free
    finally:
        back.close()
        backend.close()
    assert caplog.text.count("cannot decide claims") == 1
    assert "is back after" in caplog.text and "0 run(s) were not claimed meanwhile" in caplog.text


def test_a_lock_held_past_the_timeout_leaves_the_runs_away(postgres_url: str, postgres_prefix: str) -> None:
    import psycopg

    backend = _open(postgres_url, postgres_prefix, timeout=0.5)
    assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]
    with psycopg.connect(postgres_url) as other:  # another instance, stuck in its transaction
        other.execute("SELECT cursor FROM anarchon_jobs WHERE prefix = %s FOR UPDATE", (postgres_prefix,))
        assert backend.claim([Claim("job", 2)], "a") == [Outcome.AWAY]
    assert backend.claim([Claim("job", 2)], "a") == [Outcome.WON]
    backend.close()


def test_runs_are_decided_on_postgres_clock(postgres_url: str, postgres_prefix: str) -> None:
    backend = _open(postgres_url, postgres_prefix)
    now = backend.store_now_ms()
    claims = [
        Claim("ahead", now + 60_000),  # an instance whose clock is a minute ahead
        Claim("soon", now + 300),  # a little early: waits for its slot
        Claim("behind", now - 5_000, deadline_ms=now - 1_000),  # its deadline is past on the server's clock
    ]
    assert backend.claim(claims, "a") == [Outcome.EARLY, Outcome.WON, Outcome.UNDECIDED]
    assert backend.holder("ahead", now + 60_000) is None
    assert backend.claim([Claim("ahead", now - 1)], "b") == [Outcome.WON]  # the cursor did not move
    backend.close()


def test_asynchronous_commits_are_warned_of(
    postgres_url: str, postgres_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{postgres_url}?options=-c%20synchronous_commit%3Doff"
    with caplog.at_level(logging.WARNING, logger="anarchon_celery"):
        _open(url, postgres_prefix).close()
    assert "synchronous_commit off" in caplog.text


def test_an_unreachable_server_is_a_clear_error_without_its_password(postgres_prefix: str) -> None:
    from .support.proxy import free_port

    backend = PostgresBackend(f"postgresql://me:s3cret@127.0.0.1:{free_port()}/db", prefix=postgres_prefix, timeout=1)
    with pytest.raises(Exception, match="does not answer") as info:
        backend.open()
    assert "s3cret" not in str(info.value) and "me:**@" in str(info.value)
    assert backend.claim([Claim("job", 1)], "a") == [Outcome.AWAY]
    shown = PostgresBackend("host=db password=s3cret dbname=x", prefix=postgres_prefix).describe()
    assert "s3cret" not in shown and "password=**" in shown


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": ""}, "needs a postgresql:// URL"),
        ({"url": "postgresql://x/y", "timeout": 0}, "timeout must be a positive number"),
        ({"url": "postgresql://x/y", "prefix": "bad prefix"}, "invalid prefix"),
        ({"url": "postgresql://x/y", "lease_ms": 3_600_001}, "lease_ms must be an integer from 100"),
    ],
)
def test_bad_options_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PostgresBackend(**kwargs)
