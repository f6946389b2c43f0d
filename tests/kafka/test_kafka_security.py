"""Security end to end: TLS + SASL/SCRAM + ACLs on one broker process, every kind of client.

One broker per module, started as an operator starts it (docs/security.md):
certificates made with ``openssl``, the first super user created offline
with ``trio-coord users add --data-dir``, then ``trio-coord broker
--tls-cert --tls-key --sasl-mechanisms ... --super-users admin``. ACLs are
granted through the broker by the super user with ``trio-coord acls add``.
Checked: a plaintext client cannot talk to the TLS listeners; a wrong
password is SASL_AUTHENTICATION_FAILED; confluent-kafka, aiokafka and
kafka-python (SASL_SSL, SCRAM-SHA-256) produce and consume with the right
ACLs and are refused without them; the super user may do everything; the
native client and CLI work with TLS + SCRAM; ``groups reset-offsets``
without READ on the group is refused with a message naming the principal,
the operation and the resource; one principal cannot act as another's
group member.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from certs import make_certificates
from kafka_fixtures import KafkaBroker, start_broker, stop_broker

from trio_coord import open_admin, open_consumer, open_producer
from trio_coord.protocol.errors import (
    AuthorizationError,
    ConnectionClosedError,
    RequestTimedOutError,
    SaslAuthenticationError,
)
from trio_coord.protocol.messages import HeartbeatRequest, JoinGroupRequest, MetadataRequest
from trio_coord.security import Acl, Sasl, client_ssl_context

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
_names = itertools.count()


@dataclass
class Secured:
    """The broker and what clients need to reach it."""

    broker: KafkaBroker
    ca: str
    directory: Path

    def cli(self, *args: str, user: str = "admin", check: bool = True) -> str:
        """Run ``trio-coord ARGS --bootstrap B --tls-ca CA --user USER`` (password in env)."""
        env = {**os.environ, "TRIO_COORD_PASSWORD": PASSWORDS[user]}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "trio_coord",
                *args,
                "--bootstrap",
                self.broker.native,
                "--tls-ca",
                self.ca,
                "--user",
                user,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        if check:
            assert done.returncode == 0, done.stderr
            return done.stdout
        assert done.returncode != 0, done.stdout
        return done.stderr

    async def setup(self, topic: str | None, partitions: int, *grants: tuple[str, ...]) -> None:
        """As the super user, through the native admin client: create ``topic`` (if given)
        and grant each ``(user, operation, "topic"|"group", name)``."""
        async with open_admin(
            self.broker.native,
            ssl_context=client_ssl_context(self.ca),
            sasl=Sasl("admin", PASSWORDS["admin"]),
        ) as admin:
            if topic is not None:
                await admin.create_topic(topic, partitions)
            for user, operation, kind, resource in grants:
                acl = Acl(
                    principal=f"User:{user}",
                    operation=operation,
                    resource_type=kind,
                    name=resource,
                )
                await admin.add_acl(acl)

    def prepare(self, topic: str | None, partitions: int, *grants: tuple[str, ...]) -> None:
        """:meth:`setup`, from a test that is not async (the Kafka clients block)."""
        trio.run(self.setup, topic, partitions, *grants)

    def grant(self, user: str, operation: str, *resource: str) -> None:
        """``trio-coord acls add`` through the broker, as the super user."""
        self.cli("acls", "add", "--principal", f"User:{user}", "--operation", operation, *resource)

    def confluent(self, user: str, password: str | None = None) -> dict[str, object]:
        """confluent-kafka settings for SASL_SSL with SCRAM-SHA-256."""
        return {
            "bootstrap.servers": self.broker.kafka,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": password or PASSWORDS[user],
            "ssl.ca.location": self.ca,
        }

    def kafka_python(self, user: str) -> dict[str, object]:
        """kafka-python settings for SASL_SSL with SCRAM-SHA-256."""
        return {**self._python_login(user), "ssl_cafile": self.ca}

    def aiokafka(self, user: str) -> dict[str, object]:
        """aiokafka settings for SASL_SSL with SCRAM-SHA-256 (the CA in an SSLContext)."""
        from aiokafka.helpers import create_ssl_context

        return {**self._python_login(user), "ssl_context": create_ssl_context(cafile=self.ca)}

    def _python_login(self, user: str) -> dict[str, object]:
        """The settings aiokafka and kafka-python name alike (all but the CA)."""
        return {
            "bootstrap_servers": self.broker.kafka,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user],
        }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A broker with TLS on both listeners, SCRAM logins and ACLs; users admin (super), alice,
    bob."""
    directory = tmp_path_factory.mktemp("secured")
    make_certificates(directory)
    for user, password in PASSWORDS.items():  # offline, before the broker starts
        subprocess.run(
            [
                sys.executable,
                "-m",
                "trio_coord",
                "users",
                "add",
                user,
                "--password-stdin",
                "--data-dir",
                str(directory / "data"),
            ],
            input=password + "\n",
            check=True,
            capture_output=True,
            text=True,
        )
    broker = start_broker(
        directory,
        "--tls-cert", str(directory / "server.pem"),
        "--tls-key", str(directory / "server.key"),
        "--sasl-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        "--super-users", "admin",
    )  # fmt: skip
    try:
        yield Secured(broker, str(directory / "ca.pem"), directory)
    finally:
        stop_broker(broker)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A topic or group name no other test uses."""
    return f"s{next(_names)}-{request.node.name[:30]}"


# -- TLS and logins ----------------------------------------------------------------------------


async def test_plaintext_clients_cannot_use_the_tls_listeners(secured: Secured) -> None:
    """Without TLS the native client gets no answer; a Kafka client gets no metadata."""
    with pytest.raises((ConnectionClosedError, RequestTimedOutError)):
        async with open_admin(secured.broker.native, api_timeout=2, request_timeout=1) as admin:
            await admin.list_topics()
    from confluent_kafka.admin import AdminClient

    plain = AdminClient({"bootstrap.servers": secured.broker.kafka})
    with pytest.raises(Exception):  # noqa: B017 (librdkafka: a transport failure, any kind)
        plain.list_topics(timeout=1)


async def test_a_wrong_password_fails_authentication(secured: Secured) -> None:
    """Native: SaslAuthenticationError at once; Kafka: SASL_AUTHENTICATION_FAILED."""
    ssl_context = client_ssl_context(secured.ca)
    with pytest.raises(SaslAuthenticationError, match="alice"):
        async with open_admin(
            secured.broker.native, ssl_context=ssl_context, sasl=Sasl("alice", "wrong")
        ) as admin:
            await admin.list_topics()
    from confluent_kafka import KafkaError, Producer

    errors: list[KafkaError] = []
    producer = Producer({**secured.confluent("alice", "wrong"), "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "librdkafka reported no error"
    assert errors[0].code() == KafkaError._AUTHENTICATION
    assert "Authentication failed" in errors[0].str()  # (the broker's SaslAuthenticate answer)


async def test_plain_logins_over_tls(secured: Secured, name: str) -> None:
    """PLAIN (offered with TLS) logs in on both listeners; a wrong password is refused."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    await secured.setup(name, 1)
    plain = {**secured.confluent("admin"), "sasl.mechanisms": "PLAIN"}
    assert name in AdminClient(plain).list_topics(timeout=15).topics
    with pytest.raises(KafkaException):
        AdminClient({**plain, "sasl.password": "wrong"}).list_topics(timeout=1)
    ssl_context = client_ssl_context(secured.ca)
    sasl = Sasl("admin", PASSWORDS["admin"], "PLAIN")
    async with open_admin(secured.broker.native, ssl_context=ssl_context, sasl=sasl) as admin:
        assert name in [t.name for t in await admin.list_topics()]
    with pytest.raises(SaslAuthenticationError):
        async with open_admin(
            secured.broker.native, ssl_context=ssl_context, sasl=Sasl("admin", "no", "PLAIN")
        ) as admin:
            await admin.list_topics()


# -- Kafka clients --------------------------------------------------------------------------------


def test_confluent_kafka_needs_write_and_read_acls(secured: Secured, name: str) -> None:
    """alice produces and consumes in a group once granted WRITE, READ (topic) and READ
    (group); bob, without ACLs, is refused both with authorization errors."""
    from confluent_kafka import Consumer, KafkaError, Producer

    secured.prepare(name, 2)
    bob = Producer({**secured.confluent("bob"), "message.timeout.ms": 5000})
    errors: list[object] = []
    bob.produce(name, b"nope", on_delivery=lambda err, msg: errors.append(err))
    bob.flush(10)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    secured.prepare(
        None,
        0,
        ("alice", "write", "topic", name),
        ("alice", "read", "topic", name),
        ("alice", "read", "group", name),
    )
    producer = Producer(secured.confluent("alice"))
    for i in range(20):
        producer.produce(name, b"v%d" % i, partition=i % 2)
    assert producer.flush(15) == 0
    consumer = Consumer(
        {**secured.confluent("alice"), "group.id": name, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([name])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(message.value())
    consumer.close()
    assert sorted(got) == sorted(b"v%d" % i for i in range(20))

    # bob may read the topic, but not use the group: the join is refused.
    secured.prepare(None, 0, ("bob", "read", "topic", name))
    refused = Consumer({**secured.confluent("bob"), "group.id": name})
    refused.subscribe([name])
    seen = None
    deadline = time.monotonic() + 20
    while seen is None and time.monotonic() < deadline:
        message = refused.poll(0.2)
        if message is not None and message.error() is not None:
            seen = message.error().code()
    refused.close()
    assert seen == KafkaError.GROUP_AUTHORIZATION_FAILED


def _with_aiokafka(
    secured: Secured, topic: str, values: list[bytes]
) -> tuple[list[bytes], type[BaseException] | None]:
    """alice sends ``values`` to ``topic`` and reads them back in group ``topic``, then bob
    sends one record, all with aiokafka: what alice read, and the error bob's send raised if
    it was TopicAuthorizationFailedError (None if it succeeded)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import TopicAuthorizationFailedError

    async def run() -> tuple[list[bytes], type[BaseException] | None]:
        producer = AIOKafkaProducer(**secured.aiokafka("alice"))
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, group_id=topic, auto_offset_reset="earliest", **secured.aiokafka("alice")
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            while len(got) < len(values):
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 20)
                got += [m.value for ms in batch.values() for m in ms]
        finally:
            await consumer.stop()
        refused: type[BaseException] | None = None
        bob = AIOKafkaProducer(**secured.aiokafka("bob"))
        await bob.start()
        try:
            await asyncio.wait_for(bob.send_and_wait(topic, b"no"), 20)
        except TopicAuthorizationFailedError as exc:
            refused = type(exc)
        finally:
            await bob.stop()
        return got, refused

    return asyncio.run(run())


def _with_kafka_python(
    secured: Secured, topic: str, values: list[bytes]
) -> tuple[list[bytes], type[BaseException] | None]:
    """As :func:`_with_aiokafka`, with kafka-python."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    producer = KafkaProducer(**secured.kafka_python("alice"))
    for value in values:
        producer.send(topic, value).get(15)
    producer.close()
    consumer = KafkaConsumer(
        topic, group_id=topic, auto_offset_reset="earliest", **secured.kafka_python("alice")
    )
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(values) and time.monotonic() < deadline:
        for records in consumer.poll(500).values():
            got += [r.value for r in records]
    consumer.close()
    refused: type[BaseException] | None = None
    bob = KafkaProducer(**secured.kafka_python("bob"), max_block_ms=10_000)
    try:
        bob.send(topic, b"no").get(15)
    except TopicAuthorizationFailedError as exc:
        refused = type(exc)
    finally:
        bob.close()
    return got, refused


@pytest.mark.parametrize(
    "client", [_with_aiokafka, _with_kafka_python], ids=["aiokafka", "kafka-python"]
)
def test_python_clients_with_acls_and_without(
    secured: Secured,
    name: str,
    client: Callable[..., tuple[list[bytes], type[BaseException] | None]],
) -> None:
    """aiokafka and kafka-python over SASL_SSL + SCRAM-SHA-256: alice (granted WRITE, READ
    on the topic and READ on the group) round-trips in a group; bob, without ACLs, is
    refused with TopicAuthorizationFailedError."""
    secured.prepare(
        name,
        1,
        ("alice", "write", "topic", name),
        ("alice", "read", "topic", name),
        ("alice", "read", "group", name),
    )
    values = [b"v%d" % i for i in range(5)]
    got, refused = client(secured, name, values)
    assert sorted(got) == values
    assert refused is not None and refused.__name__ == "TopicAuthorizationFailedError"


def test_the_super_user_needs_no_acls(secured: Secured, name: str) -> None:
    """admin creates, produces, consumes in a group and deletes with no ACL at all."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(secured.confluent("admin"))
    admin.create_topics([NewTopic(name, 1)])[name].result(15)
    producer = Producer(secured.confluent("admin"))
    producer.produce(name, b"x")
    assert producer.flush(15) == 0
    consumer = Consumer(
        {**secured.confluent("admin"), "group.id": name, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([name])
    message = None
    deadline = time.monotonic() + 30
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.2)
    consumer.close()
    assert message is not None and message.error() is None and message.value() == b"x"
    admin.delete_topics([name])[name].result(15)


# -- the native client and the CLI ----------------------------------------------------------


async def test_native_clients_with_tls_and_scram(secured: Secured, name: str) -> None:
    """The native producer and consumer work as alice once granted; SCRAM-SHA-512 too."""
    await secured.setup(
        name,
        2,
        ("alice", "write", "topic", name),
        ("alice", "read", "topic", name),
        ("alice", "read", "group", name),
    )
    ssl_context = client_ssl_context(secured.ca)
    async with open_producer(
        secured.broker.native, ssl_context=ssl_context, sasl=Sasl("alice", PASSWORDS["alice"])
    ) as producer:
        for i in range(10):
            await producer.send(name, b"n%d" % i, partition=i % 2)
    sasl = Sasl("alice", PASSWORDS["alice"], "SCRAM-SHA-512")
    got: list[bytes] = []
    async with open_consumer(
        secured.broker.native,
        name,
        [name],
        ssl_context=ssl_context,
        sasl=sasl,
        offset_reset="earliest",
    ) as consumer:
        with trio.fail_after(30):
            async for record in consumer:
                got.append(record.value)
                if len(got) == 10:
                    break
    assert sorted(got) == sorted(b"n%d" % i for i in range(10))


async def test_native_refusal_names_principal_operation_and_resource(
    secured: Secured, name: str
) -> None:
    """bob may not create a topic: the error says who, what and which, and how to allow it;
    a topic he may not describe is not listed to him."""
    await secured.setup(name, 1)
    ssl_context = client_ssl_context(secured.ca)
    async with open_admin(
        secured.broker.native, ssl_context=ssl_context, sasl=Sasl("bob", PASSWORDS["bob"])
    ) as admin:
        with pytest.raises(AuthorizationError) as refused:
            await admin.create_topic(name + "-bob", 1)
        assert "User:bob may not CREATE topic" in str(refused.value)
        assert name + "-bob" in str(refused.value)
        assert name not in [t.name for t in await admin.list_topics()]


def test_cli_reset_offsets_without_read_on_the_group_is_refused(
    secured: Secured, name: str
) -> None:
    """``groups reset-offsets`` as bob (who may DESCRIBE the topic and the group, not READ
    the group) fails naming the ACL missing; as alice, with READ on the group, it works."""
    secured.prepare(
        name,
        1,
        ("bob", "describe", "topic", name),
        ("bob", "describe", "group", name),
        ("alice", "describe", "topic", name),
        ("alice", "read", "group", name),
    )
    reset = ("groups", "reset-offsets", name, "--topic", name, "--to-earliest", "--execute")
    error = secured.cli(*reset, user="bob", check=False)
    assert "User:bob may not READ group" in error and name in error
    secured.cli(*reset, user="alice")


def test_cli_users_and_acls_through_the_broker(secured: Secured) -> None:
    """The super user lists users and ACLs; another user may not change them."""
    assert "alice" in secured.cli("users", "list")
    secured.grant("bob", "describe", "--topic", "visible-", "--prefixed")
    assert "User:bob may DESCRIBE topic visible- (prefixed)" in secured.cli("acls", "list")
    error = secured.cli(
        "acls", "add", "--principal", "User:bob", "--operation", "all", "--cluster",
        user="bob", check=False,
    )  # fmt: skip
    assert "User:bob may not ALTER the cluster" in error


# -- member identity -----------------------------------------------------------------------------


async def test_a_member_id_belongs_to_the_principal_that_joined(
    secured: Secured, name: str
) -> None:
    """bob, allowed in the group, can neither heartbeat as alice's member nor join with its id."""
    await secured.setup(
        name,
        1,
        *[(user, "read", kind, name) for user in ("alice", "bob") for kind in ("topic", "group")],
    )
    ssl_context = client_ssl_context(secured.ca)
    async with open_consumer(
        secured.broker.native,
        name,
        [name],
        ssl_context=ssl_context,
        sasl=Sasl("alice", PASSWORDS["alice"]),
        session_timeout=10.0,
    ) as consumer:
        with trio.fail_after(20):
            while not consumer.member_id or consumer.generation < 0:
                await trio.sleep(0.05)
        victim = consumer.member_id
        async with open_admin(
            secured.broker.native, ssl_context=ssl_context, sasl=Sasl("bob", PASSWORDS["bob"])
        ) as admin:
            conn = admin._conn
            with pytest.raises(AuthorizationError, match="User:bob may not act as member"):
                await conn.request(HeartbeatRequest(name, victim, consumer.generation))
            join = JoinGroupRequest(name, victim, [name], 10_000, 10_000, ["range"])
            with pytest.raises(AuthorizationError, match="joined by User:alice"):
                await conn.request(join)
            await conn.request(MetadataRequest([name]))  # (the connection is still fine)
        assert consumer.member_id == victim  # alice's consumer kept its membership


def test_kafka_classic_member_impersonation_is_refused(secured: Secured, name: str) -> None:
    """bob, allowed in the group, sends classic Heartbeat, OffsetCommit and JoinGroup with
    the member id of alice's live aiokafka consumer: each is GROUP_AUTHORIZATION_FAILED,
    and alice's consumer keeps its membership and its partition."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.commit import OffsetCommitRequest
    from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest

    from trio_coord.kafka.groups import encode_subscription

    secured.prepare(
        name,
        1,
        *[(user, "read", kind, name) for user in ("alice", "bob") for kind in ("topic", "group")],
    )

    async def run() -> tuple[list[int], str, str, set[int]]:
        alice = AIOKafkaConsumer(
            name, group_id=name, session_timeout_ms=10_000, **secured.aiokafka("alice")
        )
        await alice.start()
        bob = AIOKafkaClient(**secured.aiokafka("bob"))
        try:
            async with asyncio.timeout(30):
                while not alice.assignment():
                    await alice.getmany(timeout_ms=100)
            # (aiokafka keeps the member id and generation on its coordinator; no public API)
            victim, generation = alice._coordinator.member_id, alice._coordinator.generation
            await bob.bootstrap()
            node = next(iter(bob.cluster.brokers())).nodeId
            requests = [
                HeartbeatRequest(name, generation, victim),
                OffsetCommitRequest(name, generation, victim, -1, [(name, [(0, 0, "")])]),
                JoinGroupRequest(
                    name,
                    10_000,
                    10_000,
                    victim,
                    None,
                    "consumer",
                    [("range", encode_subscription([name]))],
                ),
            ]
            codes = []
            for request in requests:
                answer = await bob.send(node, request)
                if hasattr(answer, "topics"):  # OffsetCommit: a code per partition
                    codes += [code for _, parts in answer.topics for _, code in parts]
                else:
                    codes.append(answer.error_code)
            await alice.getmany(timeout_ms=500)  # (alice still heartbeats, as herself)
            after = alice._coordinator.member_id
            return codes, victim, after, {tp.partition for tp in alice.assignment()}
        finally:
            await bob.close()
            await alice.stop()

    codes, victim, after, partitions = asyncio.run(run())
    assert codes == [30, 30, 30]  # GROUP_AUTHORIZATION_FAILED, each
    assert after == victim and partitions == {0}


def test_kip848_consumer_over_sasl_ssl_needs_read_on_the_group(secured: Secured, name: str) -> None:
    """confluent-kafka with ``group.protocol=consumer`` over SASL_SSL + SCRAM: bob, without
    READ on the group, is refused (GROUP_AUTHORIZATION_FAILED); alice, with READ on the
    group and topic, consumes; bob heartbeating with alice's member id is refused."""
    from confluent_kafka import Consumer, KafkaError, Producer

    secured.prepare(
        name,
        1,
        ("admin", "write", "topic", name),
        ("alice", "read", "topic", name),
        ("alice", "read", "group", name),
        ("bob", "read", "topic", name),
    )
    producer = Producer(secured.confluent("admin"))
    for i in range(5):
        producer.produce(name, b"c%d" % i)
    assert producer.flush(15) == 0

    def consumer(user: str) -> Consumer:
        return Consumer(
            {
                **secured.confluent(user),
                "group.id": name,
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
            }
        )

    refused = consumer("bob")
    refused.subscribe([name])
    seen = None
    deadline = time.monotonic() + 20
    while seen is None and time.monotonic() < deadline:
        message = refused.poll(0.2)
        if message is not None and message.error() is not None:
            seen = message.error()
    refused.close()
    # librdkafka makes a heartbeat's GROUP_AUTHORIZATION_FAILED fatal (_FATAL, naming it).
    assert seen is not None and seen.code() == KafkaError._FATAL, seen
    assert "ConsumerGroupHeartbeat fatal error: Broker: Group authorization failed" in seen.str()

    alice = consumer("alice")
    alice.subscribe([name])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            message = alice.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
        assert sorted(got) == [b"c%d" % i for i in range(5)]
        victim = alice.memberid()
        assert victim
        # bob, now allowed in the group, heartbeats as alice's member: refused.
        secured.prepare(None, 0, ("bob", "read", "group", name))
        assert (
            _kip848_heartbeat(secured, "bob", name, victim) == KafkaError.GROUP_AUTHORIZATION_FAILED
        )
        alice.poll(0.5)
        assert alice.memberid() == victim and {tp.partition for tp in alice.assignment()} == {0}
    finally:
        alice.close()


def _kip848_heartbeat(secured: Secured, user: str, group: str, member_id: str) -> int:
    """One ConsumerGroupHeartbeat (v0) as ``user`` (TLS, SCRAM-SHA-256 over SaslHandshake and
    SaslAuthenticate, written with kio) for ``member_id``: the answer's error code."""
    import io
    import socket
    import struct
    from datetime import timedelta

    from kio.index import load_request_schema
    from kio.serial import entity_reader, entity_writer

    from trio_coord.kafka.codec import response_schema
    from trio_coord.security.scram import ScramClient

    host, port = secured.broker.kafka.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=15)
    with client_ssl_context(secured.ca).wrap_socket(raw, server_hostname=host) as sock:
        corr = itertools.count(1)

        def recv(size: int) -> bytes:
            data = b""
            while len(data) < size:
                chunk = sock.recv(size - len(data))
                assert chunk, "the broker closed the connection"
                data += chunk
            return data

        def call(key: int, version: int, **fields: object) -> object:
            schema = load_request_schema(key, version)
            out = io.BytesIO()
            header = schema.__header_schema__
            entity_writer(header)(
                out,
                header(
                    request_api_key=key,
                    request_api_version=version,
                    correlation_id=next(corr),
                    client_id="t",
                ),
            )
            entity_writer(schema)(out, schema(**fields))
            sock.sendall(struct.pack(">i", out.tell()) + out.getvalue())
            frame = recv(struct.unpack(">i", recv(4))[0])
            answer = response_schema(key, version)
            _, used = entity_reader(answer.__header_schema__)(frame, 0)
            return entity_reader(answer)(frame, used)[0]

        assert call(17, 1, mechanism="SCRAM-SHA-256").error_code == 0
        scram = ScramClient("SCRAM-SHA-256", user, PASSWORDS[user])
        first = call(36, 2, auth_bytes=scram.first())
        final = call(36, 2, auth_bytes=scram.final(first.auth_bytes))
        assert final.error_code == 0, final.error_message
        answer = call(
            68,
            0,
            group_id=group,
            member_id=member_id,
            member_epoch=1,
            instance_id=None,
            rack_id=None,
            rebalance_timeout=timedelta(milliseconds=-1),
            subscribed_topic_names=None,
            server_assignor=None,
            topic_partitions=None,
        )
        return int(answer.error_code)
