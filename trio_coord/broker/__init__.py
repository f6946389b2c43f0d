"""The Trio shell of a broker: server, connections, coordinator service, topics, persistence.

It moves bytes and time and decides nothing the pure core could decide:
``server`` builds the nursery tree and ``open_broker``; ``handler`` routes one
connection's requests; ``coordinator`` hosts one ``group`` task per group;
``topics`` owns topic metadata; ``persistence`` makes records durable and
replays them.
"""

from .server import Broker, BrokerConfig, open_broker

__all__ = ["Broker", "BrokerConfig", "open_broker"]
