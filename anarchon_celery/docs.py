"""The places in the documentation that log messages and errors point at.

Each is a page of the site built from ``docs/`` and an anchor on it, written as the page's source
file (``docs/operations.md#rolling-deploys``): the file in a checkout, and the page
``operations.html#rolling-deploys`` of the built site. A message names one of these constants,
never a heading by its text; ``tests/test_docs.py`` checks that each exists in the built site.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DocRef", "all_refs"]


@dataclass(frozen=True)
class DocRef:
    """A page of the documentation (its file name under ``docs/``, without ``.md``) and an anchor."""

    page: str
    anchor: str

    def __str__(self) -> str:
        return f"docs/{self.page}.md#{self.anchor}"


CLAIM_ONLY = DocRef("backends", "claim-only")
SAFETY_RULE = DocRef("backends", "the-safety-rule")
REDIS_NEEDS = DocRef("backends", "redis")
SQLITE_NEEDS = DocRef("backends", "sqlite")
TASK_SIDE_OF_A_CLUSTER = DocRef("operations", "the-task-side-of-a-cluster")
NETWORK_PARTITIONS = DocRef("operations", "network-partitions")
ROLLING_DEPLOYS = DocRef("operations", "rolling-deploys")
CANNOT_SEE_EACH_OTHER = DocRef("operations", "instances-that-cannot-see-each-other")
FILE_LIMITS = DocRef("operations", "file-limits-and-footprint")
UPGRADING_FROM_CRON = DocRef("operations", "upgrading-from-the-cron-prefix")
EMBEDDED_SCHEDULER = DocRef("getting-started", "embedded-in-workers")


def all_refs() -> list[DocRef]:
    """Every place a message may point at."""
    return [value for value in globals().values() if isinstance(value, DocRef)]
