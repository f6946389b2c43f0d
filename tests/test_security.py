"""Security pieces in process: SCRAM against RFC 7677, the authorizer, Spark's blocking
client with TLS + SCRAM, and two brokers on a ZooKeeper with digest auth.

The end-to-end tests with real Kafka clients, the CLI and a broker process
are in ``tests/kafka/test_kafka_security.py``.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import msgspec
import pytest
import trio
from certs import make_certificates

from trio_coord import open_admin, open_broker, open_producer
from trio_coord.client._bootstrap import Bootstrap
from trio_coord.protocol.errors import (
    AuthorizationError,
    ConnectionClosedError,
    RequestTimedOutError,
    ResourcesExhaustedError,
    SaslAuthenticationError,
)
from trio_coord.protocol.messages import (
    DescribeGroupRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    MetadataRequest,
)
from trio_coord.security import Acl, Authorizer, ClientSecurity, Sasl, client_ssl_context
from trio_coord.security import store as security_store
from trio_coord.security.quota import MAX_THROTTLE, Quotas
from trio_coord.security.scram import (
    AuthenticationError,
    ScramClient,
    ScramCredential,
    ScramServer,
)
from trio_coord.spark._client import BlockingClient
from trio_coord.spark._options import OptionError, read_options
from trio_coord.store import open_zookeeper_store
from trio_coord.store.base import StoreError

# -- SCRAM --------------------------------------------------------------------------------------


def test_scram_client_matches_rfc_7677_example() -> None:
    """The SCRAM-SHA-256 exchange of RFC 7677, section 3, byte for byte."""
    client = ScramClient("SCRAM-SHA-256", "user", "pencil")
    client._nonce = "rOprNGfwEbeRWgbNEkqO"
    client._first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(AuthenticationError):
        client.verify(b"v=" + base64.b64encode(b"x" * 32))


@pytest.mark.parametrize(
    "message",
    [
        b"n,,n=alice,r=" + b"x" * 5000,  # oversized: more than MAX_MESSAGE
        b"\xff\xfe not utf-8",
        b"no header at all",
        b"n,,n=,r=nonce",  # no user
        b"n,,n=alice",  # no nonce
        b"n,,n=al=ice,r=nonce",  # a bare '=' in the name
        b"n,,m=ext,n=alice,r=nonce",  # an extension
    ],
)
def test_scram_server_refuses_malformed_and_oversized_first_messages(message: bytes) -> None:
    """A login message that is too long or malformed is refused with AuthenticationError
    (the connection is then closed), never an exception of another kind."""
    stored = ScramCredential.make("SCRAM-SHA-256", "pw", iterations=4096)
    server = ScramServer("SCRAM-SHA-256", lambda u, m: stored)
    with pytest.raises(AuthenticationError):
        server.step(message)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_server_accepts_the_password_and_nothing_else(mechanism: str) -> None:
    """A stored credential (no password kept) verifies the right password only; an unknown
    user fails at the same step as a wrong password."""
    stored = ScramCredential.make(mechanism, "s3cret", iterations=4096)
    assert b"s3cret" not in repr(stored).encode()

    def login(user: str, password: str) -> str | None:
        server = ScramServer(mechanism, lambda u, m: stored if u == "alice" else None)
        client = ScramClient(mechanism, user, password)
        try:
            final = server.step(client.final(server.step(client.first())))
        except AuthenticationError:
            return None
        client.verify(final)
        return server.user

    assert login("alice", "s3cret") == "alice"
    assert login("alice", "wrong") is None
    assert login("mallory", "s3cret") is None


def test_scram_server_refuses_malformed_messages() -> None:
    """Garbage, a nonce that is not the server's, or a third message: AuthenticationError."""
    stored = ScramCredential.make("SCRAM-SHA-256", "pw")
    for first in (b"", b"\xff\xfe", b"x" * 5000, b"n,,r=only-nonce", b"p=tls,,n=a,r=b"):
        with pytest.raises(AuthenticationError):
            ScramServer("SCRAM-SHA-256", lambda u, m: stored).step(first)
    server = ScramServer("SCRAM-SHA-256", lambda u, m: stored)
    server.step(b"n,,n=alice,r=abc")
    with pytest.raises(AuthenticationError, match="nonce"):
        server.step(b"c=biws,r=abcNOTTHESERVERS,p=AAAA")
    with pytest.raises(AuthenticationError):
        server.step(b"anything")


# -- the authorizer -------------------------------------------------------------------------------


def test_authorizer_denies_by_default_and_grants_what_acls_say() -> None:
    """Literal, wildcard and prefixed grants; DESCRIBE implied by READ; super users; off."""
    auth = Authorizer(enabled=True, super_users=["root"])
    assert not auth.allowed("User:alice", "read", "topic", "orders")
    auth.replace(
        [
            Acl(principal="User:alice", operation="read", resource_type="topic", name="orders"),
            Acl(
                principal="User:*",
                operation="write",
                resource_type="topic",
                name="logs-",
                prefixed=True,
            ),
            Acl(principal="User:bob", operation="all", resource_type="group", name="*"),
        ]
    )
    assert auth.allowed("User:alice", "read", "topic", "orders")
    assert auth.allowed("User:alice", "describe", "topic", "orders")
    assert not auth.allowed("User:alice", "write", "topic", "orders")
    assert not auth.allowed("User:alice", "read", "topic", "orders2")
    assert auth.allowed("User:carol", "write", "topic", "logs-app")
    assert not auth.allowed("User:carol", "write", "topic", "log")
    assert auth.allowed("User:bob", "delete", "group", "anything")
    assert not auth.allowed("User:bob", "read", "topic", "orders")
    assert auth.allowed("User:root", "delete", "cluster", "kafka-cluster")
    assert Authorizer(enabled=False).allowed("User:ANONYMOUS", "delete", "topic", "x")
    with pytest.raises(ValueError, match="operation"):
        Acl(principal="User:a", operation="steal", resource_type="topic", name="t").check()


# -- Spark's blocking client ------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CA and server certificate for the module."""
    return make_certificates(tmp_path_factory.mktemp("certs"))


async def test_spark_client_with_tls_and_scram(certificates: Path) -> None:
    """The data source's options carry TLS and the login: its blocking client reads metadata
    as alice (who may describe the topic), and a wrong password is refused."""
    async with open_broker(
        None,
        tls_cert=str(certificates / "server.pem"),
        tls_key=str(certificates / "server.key"),
        sasl_mechanisms=("SCRAM-SHA-256",),
    ) as broker:
        await security_store.add_user(broker.store, "alice", "pw", iterations=4096)
        await broker.topics.create_topic("events", 3)
        await security_store.add_acl(
            broker.store,
            Acl(principal="User:alice", operation="describe", resource_type="topic", name="events"),
        )
        await broker.security.cache.reload()
        base = {
            "bootstrap": broker.bootstrap,
            "topic": "events",
            "tlsCa": str(certificates / "ca.pem"),
        }

        def counts(password: str) -> dict[str, int]:
            options = read_options({**base, "user": "alice", "password": password}, streaming=False)
            with BlockingClient(options.bootstrap, timeout=5, security=options.security) as client:
                return client.partition_counts(["events"])

        assert await trio.to_thread.run_sync(counts, "pw") == {"events": 3}
        with pytest.raises(SaslAuthenticationError):
            await trio.to_thread.run_sync(counts, "wrong")
    with pytest.raises(OptionError, match="password"):
        read_options({"bootstrap": "127.0.0.1:1", "topic": "t", "user": "alice"}, streaming=False)


# -- a cluster on a ZooKeeper with digest auth ----------------------------------------------------


async def test_two_brokers_on_zookeeper_with_auth(
    tmp_path, zookeeper_server, zk_chroot, certificates
) -> None:
    """Brokers with TLS and SCRAM log in to ZooKeeper (--zk-auth); their nodes are closed to
    other ZooKeeper clients; an ACL added through one broker is in force on the other at once
    (watch)."""
    url = zookeeper_server.url(zk_chroot)
    zk_auth = "brokers:zk-secret"
    async with open_zookeeper_store(url, auth=zk_auth) as store:  # the first users, offline
        await security_store.add_user(store, "admin", "admin-pw", iterations=4096)
        await security_store.add_user(store, "alice", "alice-pw", iterations=4096)
    tls = {"ssl_context": client_ssl_context(certificates / "ca.pem"), "api_timeout": 20}
    settings = dict(
        store=url,
        zk_auth=zk_auth,
        sasl_mechanisms=("SCRAM-SHA-256",),
        super_users=("admin",),
        tls_cert=str(certificates / "server.pem"),
        tls_key=str(certificates / "server.key"),
        coordinator_slots=2,
        zk_session_timeout=2.0,
        claim_grace=0.2,
    )
    async with (
        open_broker(tmp_path / "b1", broker_id=1, **settings) as one,
        open_broker(tmp_path / "b2", broker_id=2, **settings) as two,
        open_admin(one.bootstrap, sasl=Sasl("admin", "admin-pw"), **tls) as admin,
        open_admin(two.bootstrap, sasl=Sasl("alice", "alice-pw"), **tls) as alice,
    ):
        await admin.create_topic("shared", 2)
        with pytest.raises(AuthorizationError, match="User:alice may not DESCRIBE topic"):
            await alice.describe_topics(["shared"])
        await admin.add_acl(
            Acl(principal="User:alice", operation="read", resource_type="topic", name="shared")
        )
        with trio.fail_after(10):  # broker two learns it from its watch
            while not two.security.authorizer.allowed("User:alice", "read", "topic", "shared"):
                await trio.sleep(0.02)
        assert [t.name for t in await alice.describe_topics(["shared"])] == ["shared"]
    async with open_zookeeper_store(url) as outsider:  # no credentials
        with pytest.raises(StoreError):
            await outsider.get("/security/users/alice")
        with pytest.raises(StoreError):
            await outsider.create("/security/users/mallory", b"{}")


def test_client_ssl_context_requires_the_ca(certificates: Path) -> None:
    """A client context from the CA file verifies the broker's certificate (the default)."""
    context = client_ssl_context(certificates / "ca.pem")
    assert context.verify_mode.name == "CERT_REQUIRED" and context.check_hostname


async def test_a_silent_client_cannot_hold_up_logins(certificates: Path) -> None:
    """A client that connects and never starts TLS is closed after auth_timeout; others log
    in meanwhile; a client that skips the login is told to log in."""
    async with open_broker(
        None,
        tls_cert=str(certificates / "server.pem"),
        tls_key=str(certificates / "server.key"),
        sasl_mechanisms=("SCRAM-SHA-256",),
        super_users=("admin",),
        auth_timeout=1.0,
        kafka_port=0,
    ) as broker:
        await security_store.add_user(broker.store, "admin", "pw", iterations=4096)
        await broker.security.cache.reload()
        assert broker.kafka_address is not None
        silent = [
            await trio.open_tcp_stream(*broker.address),
            await trio.open_tcp_stream(*broker.kafka_address),
        ]
        ssl_context = client_ssl_context(certificates / "ca.pem")
        async with open_admin(
            broker.bootstrap, ssl_context=ssl_context, sasl=Sasl("admin", "pw"), api_timeout=5
        ) as admin:
            await admin.create_topic("t", 1)
        with trio.fail_after(10):
            for stream in silent:
                assert await stream.receive_some() == b""  # closed by the broker
        with pytest.raises(SaslAuthenticationError, match="requires SASL authentication"):
            async with open_admin(broker.bootstrap, ssl_context=ssl_context, api_timeout=5) as a:
                await a.list_topics()


# -- quotas --------------------------------------------------------------------------------


def test_quota_throttle_brings_the_rate_back_to_the_quota() -> None:
    """Kafka's formula: (rate - quota) / quota x the measured span; nothing under the quota;
    principals are measured apart; the delay is bounded."""
    quotas = Quotas(produce_bytes_per_s=1000)
    assert quotas.record("User:a", "produce", 500, now=100.0) == 0.0
    assert quotas.record("User:a", "produce", 4500, now=100.5) == pytest.approx(4.0)
    assert quotas.record("User:b", "produce", 900, now=100.5) == 0.0  # another principal
    assert quotas.record("User:a", "fetch", 10**9, now=100.5) == 0.0  # no fetch quota
    assert quotas.record("User:a", "produce", 10**12, now=101.0) == MAX_THROTTLE
    assert quotas.record("User:c", "produce", 900, now=200.0) == 0.0
    assert quotas.record("User:c", "produce", 900, now=230.0) == 0.0  # a new span after idling
    with pytest.raises(ValueError):
        Quotas(fetch_bytes_per_s=0)


async def test_quotas_and_connection_limits_per_principal() -> None:
    """Over its produce quota a producer's answers are delayed (throttled), not refused; a
    principal's connections beyond max_connections_per_principal are refused."""
    async with open_broker(
        None,
        sasl_mechanisms=("SCRAM-SHA-256",),
        super_users=("admin",),
        quota_produce_bytes=20_000,
        max_connections_per_principal=2,
    ) as broker:
        await security_store.add_user(broker.store, "admin", "pw", iterations=4096)
        await broker.security.cache.reload()
        sasl = Sasl("admin", "pw")
        async with open_admin(broker.bootstrap, sasl=sasl, api_timeout=5) as admin:
            await admin.create_topic("q", 1)
            async with open_producer(broker.bootstrap, sasl=sasl, linger=0) as producer:
                for _ in range(6):
                    await producer.send("q", b"x" * 10_000)
                assert broker.security.quotas.throttled >= 1
                # admin and producer hold two connections of User:admin: a third is refused
                boot = Bootstrap(broker.bootstrap, security=ClientSecurity(sasl=sasl))
                with pytest.raises(ResourcesExhaustedError, match="max_connections_per_principal"):
                    async with boot.open(broker.address) as conn:
                        with trio.fail_after(10):
                            await conn.wait_closed()  # (said goodbye, naming the limit)
                        await conn.request(MetadataRequest([]))
            ends = await admin.list_offsets([("q", 0)])
            assert ends[("q", 0)].offset == 6


async def test_a_tls_broker_is_seen_alive_by_its_peers_probe(certificates: Path) -> None:
    """The duplicate-id probe of a cluster speaks TLS to a TLS listener: alive; a closed port
    is not."""
    from trio_coord.broker.cluster import _answers_tls
    from trio_coord.protocol.messages import BrokerInfo

    async with open_broker(
        None, tls_cert=str(certificates / "server.pem"), tls_key=str(certificates / "server.key")
    ) as broker:
        host, port = broker.address
        assert await _answers_tls(BrokerInfo(1, host, port))
    assert not await _answers_tls(BrokerInfo(1, host, port))


async def test_groups_per_principal_are_bounded() -> None:
    """With max_groups_per_principal 1, a principal in one group cannot join a second; joining
    its own group again, or another principal joining, is fine."""
    async with open_broker(
        None,
        sasl_mechanisms=("SCRAM-SHA-256",),
        super_users=("admin", "other"),
        max_groups_per_principal=1,
        min_session_timeout=0.1,
    ) as broker:
        for user in ("admin", "other"):
            await security_store.add_user(broker.store, user, "pw", iterations=4096)
        await broker.security.cache.reload()

        async def join(user: str, group: str, hold: trio.Event | None = None) -> None:
            boot = Bootstrap(broker.bootstrap, security=ClientSecurity(sasl=Sasl(user, "pw")))
            async with boot.open(broker.address) as conn:
                request = JoinGroupRequest(group, "", ["t"], 10_000, 10_000, ["range"])
                first = await conn.request(request)  # (a new member is given its id first)
                assert isinstance(first, JoinGroupResponse)
                await conn.request(msgspec.structs.replace(request, member_id=first.member_id))
                if hold is not None:
                    await hold.wait()  # (a member while its connection lives)

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(join, "admin", "g1", done)
            with trio.fail_after(10):
                while (runner := broker.coordinator.runner("g1")) is None or not (
                    runner.has_owner("User:admin")
                ):
                    await trio.sleep(0.01)
            with pytest.raises(ResourcesExhaustedError, match="max_groups_per_principal 1"):
                await join("admin", "g2")
            await join("other", "g2")
            await join("admin", "g1")  # (its own group again)
            done.set()


def test_print_config_shows_security_settings_but_not_credentials(capsys) -> None:
    """Every security flag is a setting (--config, TRIO_COORD_*); --zk-auth is not printed."""
    from trio_coord.cli import main

    argv = ["broker", "--sasl-mechanisms", "SCRAM-SHA-256", "--zk-auth", "brokers:s3cret"]
    assert main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert 'sasl-mechanisms = "SCRAM-SHA-256"  # flag' in out
    assert "max-connections-per-principal = (unset)" in out
    assert "s3cret" not in out and 'zk-auth = "(hidden)"' in out


async def test_tls_socket_stream_carries_large_frames_both_ways_at_once(certificates: Path) -> None:
    """8 MiB each way, sent while the other side sends too, arrive intact; a closed peer reads
    as b""; a receive can be cancelled and the stream still works."""
    from trio_coord.security._tls import wrap_tls
    from trio_coord.security.server import server_ssl_context

    server_context = server_ssl_context(
        str(certificates / "server.pem"), str(certificates / "server.key")
    )
    payload = bytes(range(256)) * (8 * 4096)  # 8 MiB

    async def read_all(stream: trio.abc.Stream, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = await stream.receive_some()
            assert chunk
            data += chunk
        return bytes(data)

    async def handler(raw: trio.SocketStream) -> None:
        stream = wrap_tls(raw, server_context, server_side=True)
        await stream.do_handshake()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, payload)
            assert await read_all(stream, len(payload)) == payload
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        port = listeners[0].socket.getsockname()[1]
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        client = wrap_tls(
            raw,
            client_ssl_context(certificates / "ca.pem"),
            server_side=False,
            server_hostname="127.0.0.1",
        )
        await client.do_handshake()
        with trio.move_on_after(0.01):
            await trio.sleep(1)  # (let the server start sending)
        with trio.move_on_after(0):
            await client.receive_some()  # cancelled at once: nothing lost
        async with trio.open_nursery() as both:
            both.start_soon(client.send_all, payload)
            assert await read_all(client, len(payload)) == payload
        with trio.fail_after(10):
            assert await client.receive_some() == b""  # the server closed
        await client.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await client.send_all(b"x")
        nursery.cancel_scope.cancel()


async def test_request_rate_quota_delays_answers_on_both_listeners() -> None:
    """Over quota_requests, answers (a heartbeat's too) come late but come; Kafka answers say
    how late in throttle_time."""
    async with open_broker(None, quota_requests=20, kafka_port=0) as broker:
        async with open_admin(broker.bootstrap, api_timeout=30) as admin:
            await admin.create_topic("r", 1)
            for _ in range(40):
                assert [t.name for t in await admin.list_topics()] == ["r"]
        native = broker.security.quotas.throttled
        assert native >= 1
        assert broker.kafka_address is not None
        kafka = f"{broker.kafka_address[0]}:{broker.kafka_address[1]}"

        def kafka_metadata() -> list[int]:
            from confluent_kafka.admin import AdminClient

            throttles: list[int] = []
            client = AdminClient(
                {
                    "bootstrap.servers": kafka,
                    "throttle_cb": lambda event: throttles.append(event.throttle_time),
                }
            )
            for _ in range(40):
                assert "r" in client.list_topics(timeout=30).topics
            client.poll(0.5)  # (throttle events are served by poll)
            return throttles

        throttles = await trio.to_thread.run_sync(kafka_metadata)
        assert broker.security.quotas.throttled > native
        assert any(t > 0 for t in throttles)


async def test_client_certificates_name_the_principal(certificates: Path, tmp_path: Path) -> None:
    """With --tls-client-ca a client needs a certificate signed by that CA; its CN is the
    principal, which ACLs then govern (deny by default)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    ca = certificates / "ca.pem"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "carol.key", "-out",
            "carol.csr", "-subj", "/CN=carol")  # fmt: skip
    openssl("x509", "-req", "-in", "carol.csr", "-CA", str(ca), "-CAkey",
            str(certificates / "ca.key"), "-CAcreateserial", "-out", "carol.pem",
            "-days", "2")  # fmt: skip
    async with open_broker(
        None,
        tls_cert=str(certificates / "server.pem"),
        tls_key=str(certificates / "server.key"),
        tls_client_ca=str(ca),
    ) as broker:
        await broker.topics.create_topic("certs", 1)
        carol = client_ssl_context(
            ca, certfile=tmp_path / "carol.pem", keyfile=tmp_path / "carol.key"
        )
        async with open_admin(broker.bootstrap, ssl_context=carol, api_timeout=5) as admin:
            assert await admin.list_topics() == []  # (no ACL: nothing to describe)
            with pytest.raises(AuthorizationError, match="User:carol may not CREATE"):
                await admin.create_topic("mine", 1)
            await security_store.add_acl(
                broker.store,
                Acl(principal="User:carol", operation="read", resource_type="topic", name="certs"),
            )
            with trio.fail_after(10):  # (the broker's watch reloads the ACLs)
                while not broker.security.authorizer.allowed(
                    "User:carol", "read", "topic", "certs"
                ):
                    await trio.sleep(0.01)
            assert [t.name for t in await admin.list_topics()] == ["certs"]
        with pytest.raises((ConnectionClosedError, RequestTimedOutError)):  # no certificate
            async with open_admin(
                broker.bootstrap, ssl_context=client_ssl_context(ca), api_timeout=2
            ) as admin:
                await admin.list_topics()


async def test_refused_tls_logins_leave_no_open_sockets(certificates: Path) -> None:
    """Twenty wrong passwords over TLS: the broker closes every socket it took for TLS."""
    async with open_broker(
        None,
        tls_cert=str(certificates / "server.pem"),
        tls_key=str(certificates / "server.key"),
        sasl_mechanisms=("SCRAM-SHA-256",),
    ) as broker:
        await security_store.add_user(broker.store, "alice", "pw", iterations=4096)
        await broker.security.cache.reload()
        ssl_context = client_ssl_context(certificates / "ca.pem")

        async def refused() -> None:
            with pytest.raises(SaslAuthenticationError):
                async with open_admin(
                    broker.bootstrap, ssl_context=ssl_context, sasl=Sasl("alice", "no")
                ) as admin:
                    await admin.list_topics()

        await refused()  # (warm: whatever is opened once and kept)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            await refused()
        with trio.fail_after(10):
            while len(os.listdir("/proc/self/fd")) > before + 2:
                await trio.sleep(0.05)
        assert broker.security.failed_logins == 21


async def test_requests_without_acl_checks_are_for_super_users_only(monkeypatch) -> None:
    """Deny by default, structurally: a native request or Kafka API whose ACL checks are not
    written (here: taken away) is refused to anyone but a super user."""
    import dataclasses
    import io
    import struct

    from kio.schema.list_groups.v4.request import ListGroupsRequest as KafkaListGroups
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest as KafkaAuth
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as KafkaHandshake
    from kio.serial import entity_reader, entity_writer

    from trio_coord.broker import handler
    from trio_coord.kafka.codec import response_schema

    monkeypatch.delitem(handler._ACL, DescribeGroupRequest)
    async with open_broker(
        None,
        kafka_port=0,
        sasl_mechanisms=("SCRAM-SHA-256", "PLAIN"),
        allow_plain_without_tls=True,
        super_users=("admin",),
    ) as broker:
        for user in ("admin", "bob"):
            await security_store.add_user(broker.store, user, "pw", iterations=4096)
        await security_store.add_acl(
            broker.store,
            Acl(principal="User:bob", operation="all", resource_type="group", name="*"),
        )
        await broker.security.cache.reload()
        await broker.coordinator.create_group("g")
        for user, refused in (("bob", True), ("admin", False)):
            async with open_admin(broker.bootstrap, sasl=Sasl(user, "pw"), api_timeout=5) as a:
                if refused:
                    with pytest.raises(AuthorizationError, match="User:bob may not ALTER"):
                        await a.describe_group("g")
                else:
                    assert (await a.describe_group("g")).group_id == "g"

        assert broker.kafka is not None and broker.kafka_address is not None
        table = broker.kafka.front.table.apis
        monkeypatch.setitem(table, 16, dataclasses.replace(table[16], authorizes=False))

        async def kafka_list_groups(user: str) -> int:
            stream = await trio.open_tcp_stream(*broker.kafka_address)
            corr = 0

            async def ask(key: int, version: int, body: object) -> object:
                nonlocal corr
                corr += 1
                out = io.BytesIO()
                header = type(body).__header_schema__  # type: ignore[attr-defined]
                head = header(request_api_key=key, request_api_version=version,
                              correlation_id=corr, client_id="t")  # fmt: skip
                entity_writer(header)(out, head)
                entity_writer(type(body))(out, body)
                data = out.getvalue()
                await stream.send_all(struct.pack(">i", len(data)) + data)
                frame = b""
                while len(frame) < 4 or len(frame) < 4 + struct.unpack(">i", frame[:4])[0]:
                    chunk = await stream.receive_some()
                    assert chunk, "the broker closed the connection"
                    frame += chunk
                schema = response_schema(key, version)
                _, used = entity_reader(schema.__header_schema__)(frame[4:], 0)
                return entity_reader(schema)(frame[4:], used)[0]

            await ask(17, 1, KafkaHandshake(mechanism="PLAIN"))
            auth = await ask(36, 2, KafkaAuth(auth_bytes=f"\0{user}\0pw".encode()))
            assert auth.error_code == 0  # type: ignore[attr-defined]
            listed = await ask(16, 4, KafkaListGroups(states_filter=()))
            await stream.aclose()
            return int(listed.error_code)  # type: ignore[attr-defined]

        assert await kafka_list_groups("bob") == 31  # CLUSTER_AUTHORIZATION_FAILED
        assert await kafka_list_groups("admin") == 0
