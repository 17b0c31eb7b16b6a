"""One message the broker can never accept never stalls the outbox or duplicates its
round-mates; ``publish()`` refuses such a message up front.

Real relays (``taskclaim_relay`` subprocesses, or ``Relay`` in a thread) against the
RabbitMQ and NATS JetStream on 127.0.0.1, counted on the broker's side. "Broker down"
is a TCP forwarder in front of the real broker that the test closes and opens again, so
the shared brokers keep running for everyone else.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.contrib.messages.storage.fallback import FallbackStorage
from django.db import connections

from django_taskclaim.admin import ClaimableAdminMixin
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.outbox.brokers import make_publisher
from django_taskclaim.outbox.publisher import MessagesRejected, PublishError
from django_taskclaim.outbox.relay import MESSAGE_ATTEMPTS, Relay
from django_taskclaim.outbox.write import publish
from tests.support.helpers import wait_for
from tests.support.outbox_brokers import BROKERS
from tests.support.outboxapp.models import Message
from tests.support.worker_procs import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = "outboxapp.Message"

#: A row each broker can never accept (written past ``publish()``, as by an older
#: version or a raw insert): a 400-byte routing key for RabbitMQ (200 characters fit the
#: column), a header name with a space for NATS.
BAD = {
    "rabbitmq": ({"topic": "é" * 200}, "255"),
    "nats": ({"headers": {"bad header": "x"}}, "header"),
}


@pytest.fixture(params=sorted(BROKERS))
def broker(request):
    cls, down = BROKERS[request.param]
    reason = down()
    if reason:
        pytest.skip(reason)
    b = cls()
    yield b
    b.close()


@pytest.fixture
def procs():
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.close()


def relay_proc(procs: list[WorkerProc], publisher: str, url: str, *args: str) -> WorkerProc:
    p = WorkerProc(LABEL, "--publisher", publisher, "--url", url, *args, command="taskclaim_relay")
    procs.append(p)
    wait_for(
        lambda: "taskclaim relay" in p.stdout() or not p.alive(),
        timeout=30,
        what="relay startup line",
    )
    assert p.alive(), f"relay exited early:\n{p.stdout()}\n{p.stderr()}"
    return p


def good_and_bad(broker: Any) -> tuple[list[Message], Message]:
    """Nine good messages over three keys, a bad one of key k0 in the middle (its
    round-mates are k1's and k2's messages)."""
    good = [publish(broker.topic, {"i": i}, key=f"k{i % 3}") for i in range(4)]
    fields, _ = BAD[broker.publisher]
    bad = Message.objects.create(
        **{"topic": broker.topic, "key": "k0", "payload": {"bad": True}, **fields}
    )
    good += [publish(broker.topic, {"i": i}, key=f"k{i % 3}") for i in range(4, 9)]
    return good, bad


def unsettled() -> int:
    return Message.objects.in_state("ready", "processing").count()


def assert_good_once_bad_failed(broker: Any, good: list[Message], bad: Message) -> None:
    copies = Counter(d.message_id for d in broker.drain())
    assert copies == Counter({m.idempotency_key: 1 for m in good}), copies
    assert set(Message.objects.done().values_list("pk", flat=True)) == {m.pk for m in good}
    bad.refresh_from_db()
    assert bad.claim_state == "failed"
    assert BAD[broker.publisher][1] in bad.last_error


def run_relay_until_settled(relay: Relay, timeout: float = 60) -> None:
    """Run ``relay`` in a thread until every row is settled (or fail, stopping it)."""
    thread = threading.Thread(target=lambda: (relay.run(), connections.close_all()))
    thread.start()
    try:
        wait_for(lambda: unsettled() == 0, timeout=timeout, what="every row settled")
    finally:
        relay.stop()
        thread.join(60)
    assert not thread.is_alive()


# -- publish() ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("é" * 200, {}), {}, "400 bytes"),
        (("orders created", {}), {}, "whitespace"),
        (("orders\tcreated", {}), {}, "whitespace"),
        (("orders..created", {}), {}, "empty token"),
        (("orders.>", {}), {}, "wildcard"),
        (("\ud800", {}), {}, "Unicode"),
        (("orders", {}), {"headers": {"bad header": "x"}}, "header name"),
        (("orders", {}), {"headers": {"x" * 256: "v"}}, "256 bytes"),
        (("orders", {}), {"headers": {"trace": "a\r\nb"}}, "line break"),
        (("orders", {}), {"key": "k\n1"}, "line break"),
        (("orders", {"s": "\ud800"}), {}, "JSON"),
    ],
)
def test_publish_refuses_a_message_a_broker_can_never_accept(args, kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        publish(*args, **kwargs)
    assert "\n" not in str(err.value).replace("\\n", "")
    assert Message.objects.count() == 0


def test_outbox_brokers_narrows_the_rules_to_the_model_s_broker(monkeypatch):
    monkeypatch.setattr(Message, "outbox_brokers", ("rabbitmq",))
    publish("orders created", {})  # a RabbitMQ routing key may hold a space
    with pytest.raises(ValueError, match="RabbitMQ"):
        publish("é" * 200, {})
    monkeypatch.setattr(Message, "outbox_brokers", ())
    publish("é" * 200, {})
    monkeypatch.setattr(Message, "outbox_brokers", ("smtp",))
    with pytest.raises(ConfigurationError, match="smtp"):
        publish("orders", {})
    assert Message.objects.count() == 2


@pytest.mark.parametrize("name", sorted(BROKERS))
def test_each_publisher_refuses_before_sending_what_publish_would_have_refused(name):
    pytest.importorskip("pika" if name == "rabbitmq" else "nats")
    publisher = make_publisher(name, BROKERS[name][0].url)  # no connection is opened
    row = Message(topic="orders", key="k", payload={}, idempotency_key="i1")
    assert publisher.refusal(row) is None
    row.headers = ["not", "an", "object"]
    assert publisher.refusal(row) == "headers are not a JSON object"
    row.headers, row.payload = {}, {"s": "\ud800"}
    assert "payload cannot be encoded" in publisher.refusal(row)


# -- the relay, real brokers ----------------------------------------------------------


def test_a_bad_message_fails_and_its_round_mates_go_once(procs, broker):
    good, bad = good_and_bad(broker)
    relay_proc(procs, broker.publisher, broker.url, "--partitions", "1", "--poll", "0.1")
    wait_for(lambda: unsettled() == 0, timeout=60, what="every row settled")
    assert_good_once_bad_failed(broker, good, bad)


def test_what_the_client_raises_for_one_message_fails_that_message_only(broker):
    """The same, past the publisher's own up-front check: the broker client's exception
    (pika's ShortStringTooLong, nats-py's BadHeaderError) is classified per message."""
    good, bad = good_and_bad(broker)
    publisher = make_publisher(broker.publisher, broker.url)
    publisher.refusal = lambda message: None  # type: ignore[attr-defined]
    run_relay_until_settled(Relay(Message, publisher, backoff=0.05))
    assert_good_once_bad_failed(broker, good, bad)
    bad.refresh_from_db()
    assert ("ShortStringTooLong" if broker.publisher == "rabbitmq" else "BadHeader") in (
        bad.last_error
    )


class Forwarder:
    """A TCP forwarder to a broker's port; :meth:`down` closes it and cuts every
    connection through it, :meth:`up` opens it again on the same port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
            listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.mark.slow
def test_broker_down_loses_nothing_and_still_fails_only_the_bad_one(procs, broker):
    forwarder = Forwarder(5672 if broker.publisher == "rabbitmq" else 4222)
    url = (
        f"amqp://guest:guest@127.0.0.1:{forwarder.port}/%2F"
        if broker.publisher == "rabbitmq"
        else f"nats://127.0.0.1:{forwarder.port}"
    )
    try:
        p = relay_proc(
            procs, broker.publisher, url, "--partitions", "1", "--poll", "0.1", "--timeout", "2"
        )
        forwarder.down()
        good, bad = good_and_bad(broker)
        try:
            wait_for(
                lambda: p.stderr().count("publish failed") >= 2,
                timeout=60,
                what="the relay to retry against the broker that is down",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nrelay stderr:\n{p.stderr()[-3000:]}") from None
        assert Message.objects.done().count() == 0
        # Nothing lost, nothing given up (the bad one waits behind its key's first round).
        assert unsettled() == len(good) + 1
        assert not Message.objects.failed().exists()
        forwarder.up()
        wait_for(lambda: unsettled() == 0, timeout=90, what="every row settled")
    finally:
        forwarder.down()
    assert p.alive()
    delivered = {d.message_id for d in broker.drain()}
    assert delivered == {m.idempotency_key for m in good}
    assert Message.objects.done().count() == len(good)
    assert list(Message.objects.failed()) == [bad]


# -- the relay's rules, with a stand-in publisher ----------------------------------------


class ScriptedPublisher:
    """Fails chosen messages on their own (``PublishError.errors``) a number of times,
    confirms the others; records what reached the "broker"."""

    def __init__(self, failures: dict[str, int]) -> None:
        self.failures = failures
        self.sent: list[str] = []

    def connect(self) -> None:
        pass

    def publish_batch(self, messages) -> None:
        ok, errors = [], {}
        for m in messages:
            if self.failures.get(m.idempotency_key, 0) > 0:
                self.failures[m.idempotency_key] -= 1
                errors[m.idempotency_key] = "SomeClientError: cannot"
            else:
                ok.append(m.idempotency_key)
        self.sent += ok
        if errors:
            raise PublishError("some failed", confirmed=ok, errors=errors)

    def close(self) -> None:
        pass


def test_a_message_failing_on_its_own_is_failed_after_the_documented_attempts():
    stuck = publish("t", {"n": 0}, key="a")
    flaky = publish("t", {"n": 1}, key="b")
    mates = [publish("t", {"n": i}, key=k) for i, k in enumerate("cdab", start=2)]
    pub = ScriptedPublisher({stuck.idempotency_key: 10**6, flaky.idempotency_key: 2})
    assert Relay(Message, pub, backoff=0.01, backoff_max=0.02).run(burst=True) == 5
    stuck.refresh_from_db()
    assert stuck.claim_state == "failed"
    assert f"failed {MESSAGE_ATTEMPTS} times in a row" in stuck.last_error
    assert "SomeClientError" in stuck.last_error
    assert Counter(pub.sent) == Counter(m.idempotency_key for m in [flaky, *mates])
    assert Message.objects.done().count() == 5


def test_a_broker_that_is_down_never_fails_a_message():
    write = [publish("t", {"n": i}, key=f"k{i}") for i in range(3)]

    class Down:
        calls = 0

        def connect(self) -> None:
            pass

        def publish_batch(self, messages) -> None:
            Down.calls += 1
            if Down.calls < 3 * MESSAGE_ATTEMPTS:
                raise PublishError("cannot reach the broker")

        def close(self) -> None:
            pass

    assert Relay(Message, Down(), backoff=0.01, backoff_max=0.02).run(burst=True) == 3
    assert Message.objects.done().count() == len(write)
    assert not issubclass(PublishError, MessagesRejected)


# -- the admin ------------------------------------------------------------------------------


class MessageAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    pass


def test_a_failed_message_shows_its_error_in_the_admin_and_can_be_requeued(rf, rabbit_or_skip):
    bad = Message.objects.create(topic="é" * 200, key="k", payload={})
    relay = Relay(Message, make_publisher("rabbitmq", rabbit_or_skip.url))
    run_relay_until_settled(relay)
    bad.refresh_from_db()
    model_admin = MessageAdmin(Message, admin.AdminSite())
    assert "255" in model_admin.short_error(bad)
    request = rf.post("/")
    request.user = User.objects.create_superuser("root", "root@example.com", "x")
    request.session = {}
    request._messages = FallbackStorage(request)
    model_admin.taskclaim_retry_failed(request, Message.objects.all())
    bad.refresh_from_db()
    assert bad.claim_state == "ready"
    assert [str(m) for m in request._messages] == ["Retry failed: 1 done, 0 skipped."]


@pytest.fixture
def rabbit_or_skip():
    cls, down = BROKERS["rabbitmq"]
    reason = down()
    if reason:
        pytest.skip(reason)
    b = cls()
    yield b
    b.close()
