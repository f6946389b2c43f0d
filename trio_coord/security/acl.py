"""Principals, ACLs and the authorizer: who may do what to which topic, group or cluster.

Its one job is the decision ``allowed(principal, operation, resource)``. An
:class:`Acl` grants one principal (``User:alice``, or ``User:*`` for every
authenticated one) one operation on a topic, a group or the cluster, by
literal name (``*`` for every name) or by name prefix. Operations follow
Kafka's: READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE (implied by any of the
first five, as in Kafka) and ALL. The :class:`Authorizer` is deny by
default once authentication is on, lets super users do everything, and is
fed its ACLs (from the store, by :mod:`.store`) as a whole new set each time,
so a check is a few dictionary lookups and never waits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

__all__ = [
    "ANONYMOUS",
    "OPERATIONS",
    "RESOURCE_TYPES",
    "Acl",
    "Authorizer",
    "principal_of",
]

ANONYMOUS: Final = "User:ANONYMOUS"
"""The principal of a connection that did not authenticate."""
OPERATIONS: Final = ("read", "write", "create", "delete", "alter", "describe", "all")
RESOURCE_TYPES: Final = ("topic", "group", "cluster")
CLUSTER: Final = "kafka-cluster"
"""The one cluster resource's name (as Kafka names it)."""
_IMPLIES_DESCRIBE: Final = frozenset({"read", "write", "delete", "alter", "describe", "all"})


def principal_of(name: str) -> str:
    """``alice`` or ``User:alice`` → ``User:alice`` (ValueError for an empty name)."""
    name = name.strip()
    if name.startswith("User:"):
        name = name[5:]
    if not name:
        raise ValueError("a principal needs a user name (User:NAME)")
    return f"User:{name}"


class Acl(msgspec.Struct, frozen=True, kw_only=True):
    """One grant: ``principal`` may do ``operation`` on a resource (see the module docstring)."""

    principal: str
    operation: str
    resource_type: str
    name: str = CLUSTER
    prefixed: bool = False

    def check(self) -> Acl:
        """This ACL, or ValueError saying what is wrong with it."""
        if not self.principal.startswith("User:") or len(self.principal) == 5:
            raise ValueError(f"principal {self.principal!r} is not User:NAME (or User:*)")
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation {self.operation!r} is not one of {', '.join(OPERATIONS)}")
        if self.resource_type not in RESOURCE_TYPES:
            raise ValueError(f"resource type {self.resource_type!r} is not topic, group, cluster")
        if not self.name:
            raise ValueError("an ACL needs a resource name (--topic T, --group G or --cluster)")
        if self.resource_type == "cluster" and (self.name != CLUSTER or self.prefixed):
            raise ValueError("the cluster resource has no name and cannot be prefixed")
        return self

    def describe(self) -> str:
        """One line: ``User:alice may READ topic orders (prefixed)``."""
        what = (
            "the cluster"
            if self.resource_type == "cluster"
            else (f"{self.resource_type} {self.name}")
        )
        return (
            f"{self.principal} may {self.operation.upper()} {what}"
            f"{' (prefixed)' if self.prefixed else ''}"
        )

    def key(self) -> str:
        """A name for this ACL that is the same wherever it is computed (the store's node)."""
        import hashlib

        return hashlib.sha256(msgspec.json.encode(self)).hexdigest()[:32]


class Authorizer:
    """Decides each request: on (deny by default) or off (everything allowed).

    ``enabled`` is True on a broker that authenticates its connections.
    ``super_users`` are principals that bypass ACLs. :meth:`replace` swaps in
    a new set of ACLs at once (a store watch calls it).
    """

    def __init__(self, *, enabled: bool, super_users: Iterable[str] = ()) -> None:
        self.enabled = enabled
        self.super_users = frozenset(principal_of(u) for u in super_users)
        self.acls: tuple[Acl, ...] = ()
        self._literal: dict[tuple[str, str, str], set[str]] = {}
        self._prefixed: dict[tuple[str, str], list[tuple[str, str]]] = {}

    def replace(self, acls: Iterable[Acl]) -> None:
        """Use exactly ``acls`` from now on."""
        literal: dict[tuple[str, str, str], set[str]] = {}
        prefixed: dict[tuple[str, str], list[tuple[str, str]]] = {}
        kept = tuple(acls)
        for acl in kept:
            if acl.prefixed:
                prefixed.setdefault((acl.principal, acl.resource_type), []).append(
                    (acl.name, acl.operation)
                )
            else:
                literal.setdefault((acl.principal, acl.resource_type, acl.name), set()).add(
                    acl.operation
                )
        self.acls, self._literal, self._prefixed = kept, literal, prefixed

    def allowed(self, principal: str, operation: str, resource_type: str, name: str) -> bool:
        """May ``principal`` do ``operation`` on the resource? (True when not enabled.)"""
        if not self.enabled or principal in self.super_users:
            return True
        for who in (principal, "User:*"):
            for resource in (name, "*"):
                granted = self._literal.get((who, resource_type, resource))
                if granted and _grants(granted, operation):
                    return True
            for prefix, granted_op in self._prefixed.get((who, resource_type), ()):
                if name.startswith(prefix) and _grants((granted_op,), operation):
                    return True
        return False

    def allowed_any(self, principal: str, operation: str, resource_type: str) -> bool:
        """May ``principal`` do ``operation`` on some resource of this type?"""
        if not self.enabled or principal in self.super_users:
            return True
        return any(
            acl.principal in (principal, "User:*")
            and acl.resource_type == resource_type
            and _grants((acl.operation,), operation)
            for acl in self.acls
        )

    def is_super(self, principal: str) -> bool:
        """True for a super user (or when authorization is off)."""
        return not self.enabled or principal in self.super_users


def _grants(granted: Iterable[str], operation: str) -> bool:
    for op in granted:
        if op == operation or op == "all":
            return True
        if operation == "describe" and op in _IMPLIES_DESCRIBE:
            return True
    return False
