"""Trio clients: the group consumer and the admin client.

``open_consumer`` joins a group and obeys its coordinator; ``open_admin``
manages topics and groups. Both find brokers through a bootstrap list and
retry with backoff while none answers.
"""

from .admin import Admin, open_admin
from .consumer import Consumer, ConsumerState, PartitionsCallback, open_consumer

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerState",
    "PartitionsCallback",
    "open_admin",
    "open_consumer",
]
