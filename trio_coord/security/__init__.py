"""Security: TLS, SASL logins (SCRAM, PLAIN), ACLs and member identity.

The package holds everything both ends need to know about who a peer is and
what it may do: :mod:`.scram` (the SASL exchanges), :mod:`.acl` (principals,
ACLs, the deny-by-default authorizer), :mod:`.store` (users and ACLs in the
metadata store, and a broker's watched cache of them), :mod:`.server` (a
broker's TLS context and logins) and :mod:`.client` (a client's). See
``docs/security.md`` for how to set it up.
"""

from .acl import ANONYMOUS as ANONYMOUS
from .acl import Acl as Acl
from .acl import Authorizer as Authorizer
from .acl import principal_of as principal_of
from .client import ClientSecurity as ClientSecurity
from .client import Sasl as Sasl
from .client import client_ssl_context as client_ssl_context
from .scram import ScramCredential as ScramCredential

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
