"""The security commands: ``users`` (SCRAM credentials) and ``acls`` (allow/deny rules).

Both work through a broker (with a super user's login) or offline against the store
named by ``--store``/``--data-dir``, for the first user of a cluster that denies by
default.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from ..client import open_admin
from ..security import store as security_store
from ..security.acl import CLUSTER, Acl, principal_of
from ..store import open_embedded_store, open_zookeeper_store
from ..store.base import MetadataStore
from ._common import UsageError, _timeouts
from .render import _say


@contextlib.asynccontextmanager
async def _offline_store(args: argparse.Namespace) -> AsyncIterator[MetadataStore | None]:
    """The store named by ``--store``/``--data-dir`` (offline), or None: through a broker."""
    if args.store:
        async with open_zookeeper_store(args.store, auth=args.zk_auth) as store:
            yield store
    elif args.data_dir:
        async with open_embedded_store(args.data_dir) as store:
            yield store
    else:
        yield None


def _read_new_password(args: argparse.Namespace) -> str:
    if not args.password_stdin:
        raise UsageError("give the new password on stdin with --password-stdin")
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("the password read from stdin is empty")
    return password


async def cmd_users(args: argparse.Namespace) -> None:
    """users add / list / delete, offline on a store or through a broker as a super user."""
    password = _read_new_password(args) if args.action == "add" else ""
    mechanisms = getattr(args, "mechanism", None) or ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    async with _offline_store(args) as store:
        if store is not None:
            if args.action == "add":
                await security_store.add_user(store, args.name, password, mechanisms)
                result: Any = True
            elif args.action == "delete":
                result = await security_store.delete_user(store, args.name)
            else:
                result = await security_store.list_users(store)
        else:
            async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
                if args.action == "add":
                    await admin.add_user(args.name, password, mechanisms)
                    result = True
                elif args.action == "delete":
                    result = await admin.delete_user(args.name)
                else:
                    result = await admin.list_users()
    if args.action == "list":
        lines = [f"{name}  {', '.join(m)}" for name, m in sorted(result.items())]
        _say(args, result, "\n".join(lines) or "(no users)")
    elif args.action == "add":
        _say(args, {"user": args.name, "mechanisms": mechanisms}, f"user {args.name} saved")
    else:
        if not result:
            raise UsageError(f"there is no user {args.name!r}")
        _say(args, {"user": args.name, "deleted": True}, f"user {args.name} deleted")


def _acl_of(args: argparse.Namespace) -> Acl:
    chosen = [x for x in (args.topic, args.group) if x is not None] + (
        ["c"] if args.cluster else []
    )
    if len(chosen) != 1:
        raise UsageError("give exactly one resource: --topic T, --group G or --cluster")
    if args.topic is not None:
        kind, name = "topic", args.topic
    elif args.group is not None:
        kind, name = "group", args.group
    else:
        kind, name = "cluster", CLUSTER
    try:
        return Acl(
            principal=principal_of(args.principal),
            operation=args.operation,
            resource_type=kind,
            name=name,
            prefixed=args.prefixed,
        ).check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def cmd_acls(args: argparse.Namespace) -> None:
    """acls add / list / remove, offline on a store or through a broker as a super user."""
    acl = _acl_of(args) if args.action != "list" else None
    async with _offline_store(args) as store:
        if store is not None:
            if args.action == "add":
                assert acl is not None
                result: Any = await security_store.add_acl(store, acl)
            elif args.action == "remove":
                assert acl is not None
                result = await security_store.remove_acls(store, acl)
            else:
                result = await security_store.list_acls(store)
        else:
            async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
                if args.action == "add":
                    assert acl is not None
                    result = await admin.add_acl(acl)
                elif args.action == "remove":
                    assert acl is not None
                    result = await admin.remove_acl(acl)
                else:
                    result = await admin.list_acls()
    if args.action == "list":
        _say(
            args,
            [msgspec.to_builtins(a) for a in result],
            "\n".join(a.describe() for a in result) or "(no ACLs)",
        )
    elif args.action == "add":
        assert acl is not None
        _say(args, {"added": bool(result)}, acl.describe() + ("" if result else " (already)"))
    else:
        if not result:
            raise UsageError("no ACL matched")
        _say(args, {"removed": result}, f"{result} ACL(s) removed")
