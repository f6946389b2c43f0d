"""Security: TLS, SASL logins (SCRAM, PLAIN), ACLs and member identity.

The package holds everything both ends need to know about who a peer is and
what it may do: :mod:`.scram` (the SASL exchanges), :mod:`.acl` (principals,
ACLs, the deny-by-default authorizer), :mod:`.store` (users and ACLs in the
metadata store, and a broker's watched cache of them), :mod:`.server` (a
broker's TLS context and logins) and :mod:`.client` (a client's). See
``docs/security.md`` for how to set it up.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .acl import ANONYMOUS as ANONYMOUS
    from .acl import Acl as Acl
    from .acl import Authorizer as Authorizer
    from .acl import principal_of as principal_of
    from .client import ClientSecurity as ClientSecurity
    from .client import Sasl as Sasl
    from .client import client_ssl_context as client_ssl_context
    from .scram import ScramCredential as ScramCredential

if not TYPE_CHECKING:  # (mypy would take every name the module lacks for an Any)
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "ANONYMOUS": ".acl",
            "Acl": ".acl",
            "Authorizer": ".acl",
            "principal_of": ".acl",
            "ClientSecurity": ".client",
            "Sasl": ".client",
            "client_ssl_context": ".client",
            "ScramCredential": ".scram",
        },
    )

__all__ = [
    "ANONYMOUS",
    "Acl",
    "Authorizer",
    "ClientSecurity",
    "Sasl",
    "ScramCredential",
    "client_ssl_context",
    "principal_of",
]
