"""Putting a member in a core ``Group`` for a test: one JoinGroup's values, with defaults.

The core tests admit members either the way the broker does (``join``:
``validate_join``, then ``add_member`` with the same values) or, where
validation is not the point, by ``add_member`` alone. A test names only the
values it is about; the others are the defaults below (one topic ``t``, a 10 s
session, a 5 s rebalance timeout, the ``range`` assignor, auto-commit,
``earliest``, and the member id as its client id). A file whose members share
other values binds them once (``functools.partial``) instead of writing its own
copy of the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trio_coord.core.assignors import ASSIGNORS
from trio_coord.core.group import Group, GroupLimits, Member

DEFAULTS: dict[str, Any] = {
    "host": "h",
    "topics": ("t",),
    "session_timeout": 10.0,
    "rebalance_timeout": 5.0,
    "assignors": ("range",),
    "auto_commit": True,
    "offset_reset": "earliest",
}

# What add_member takes but validate_join does not (the rest they share).
_NOT_VALIDATED = ("host", "auto_commit", "owned")


def _values(member_id: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"client_id": member_id, **DEFAULTS, **values}


def add_member(group: Group, member_id: str, now: float = 0.0, **values: Any) -> Member:
    """Admit ``member_id`` to ``group`` at ``now`` without validating the join.

    ``values`` are ``Group.add_member``'s keyword arguments, each defaulting
    as the module docstring says.
    """
    return group.add_member(now, member_id=member_id, **_values(member_id, values))


def join(
    group: Group,
    member_id: str,
    now: float = 0.0,
    *,
    limits: GroupLimits,
    available: Mapping[str, Any] = ASSIGNORS,
    **values: Any,
) -> Member:
    """Validate ``member_id``'s join against ``limits`` and ``available``, then admit it.

    Raises what ``Group.validate_join`` raises, and then admits no one.
    ``values`` as for :func:`add_member`; all but ``host``, ``auto_commit`` and
    ``owned`` are validated.
    """
    full = _values(member_id, values)
    group.validate_join(
        member_id=member_id,
        limits=limits,
        available=available,
        **{k: v for k, v in full.items() if k not in _NOT_VALIDATED},
    )
    return group.add_member(now, member_id=member_id, **full)
