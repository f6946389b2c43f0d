"""Validation of the names users choose: topic names, group ids and subscriptions.

The rules are Kafka's, so that names move between the systems: 1 to 249
characters from ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``. They also keep
names safe as metadata-store path segments.
"""

from __future__ import annotations

import re

from ..protocol.errors import InvalidGroupIdError, InvalidTopicError

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_SUBSCRIPTION_ENTRIES",
    "PATTERN_PREFIX",
    "validate_group_id",
    "validate_subscription",
    "validate_topic_name",
]

MAX_NAME_LENGTH = 249
MAX_SUBSCRIPTION_ENTRIES = 1000
"""The most topic names and patterns one member may subscribe to (a pattern covers many):
the group keeps, persists and describes every entry for the member's life."""
PATTERN_PREFIX = "re:"
"""A subscription entry starting with this is a regular expression over topic names."""
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def _problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is longer than {MAX_NAME_LENGTH} characters"
    if name in (".", ".."):
        return "may not be '.' or '..'"
    if not _LEGAL.fullmatch(name):
        return "may only contain letters, digits, '.', '_' and '-'"
    return None


def validate_topic_name(name: str) -> str:
    """Return ``name`` if it is a legal topic name, else raise INVALID_TOPIC."""
    problem = _problem(name)
    if problem:
        raise InvalidTopicError(f"topic name {name!r} {problem}")
    return name


def validate_group_id(group_id: str) -> str:
    """Return ``group_id`` if it is a legal group id, else raise INVALID_GROUP_ID."""
    problem = _problem(group_id)
    if problem:
        raise InvalidGroupIdError(f"group id {group_id!r} {problem}")
    return group_id


def validate_subscription(entries: list[str]) -> None:
    """Raise INVALID_TOPIC for a subscription entry that is no legal topic name.

    Entries starting with :data:`PATTERN_PREFIX` are patterns, checked where
    they are compiled. A name that could never be a topic would otherwise
    sit in the group's state and records, and in every answer that lists it;
    so would more than :data:`MAX_SUBSCRIPTION_ENTRIES` entries.
    """
    if len(entries) > MAX_SUBSCRIPTION_ENTRIES:
        raise InvalidTopicError(
            f"a subscription of {len(entries)} entries is more than the "
            f"{MAX_SUBSCRIPTION_ENTRIES} a member may name; subscribe to a pattern "
            f"({PATTERN_PREFIX}PATTERN) that covers the topics instead"
        )
    for entry in entries:
        if not entry.startswith(PATTERN_PREFIX):
            problem = _problem(entry)
            if problem:
                raise InvalidTopicError(
                    f"subscription entry {entry[:300]!r} {problem}: subscribe to topic names, "
                    f"or to patterns written {PATTERN_PREFIX}PATTERN"
                )
