"""The transactional outbox: publish() inside transactions, the relay, real brokers.

The broker tests run against the RabbitMQ and NATS JetStream on 127.0.0.1 and are
skipped, with the reason, when one does not answer or its client library is absent.
Relays run in-process (``Relay.run(burst=True)``) or as ``taskclaim_relay``
subprocesses, killed with SIGKILL where the test says so.
"""

from __future__ import annotations

import itertools
import signal
import threading
from collections import Counter, defaultdict

import pytest
from django.db import connections, transaction

from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.outbox.brokers import make_publisher
from django_taskclaim.outbox.models import KEY_HASH_SPACE, key_hash, partition_range
from django_taskclaim.outbox.publisher import MessagesRejected, PublishError
from django_taskclaim.outbox.relay import Relay, rounds
from django_taskclaim.outbox.write import publish
from django_taskclaim.settle.batch import complete_many
from tests.support.helpers import wait_for
from tests.support.outbox_brokers import BROKERS, RabbitQueue, rabbit_down_reason
from tests.support.outboxapp.models import Message, Order
from tests.support.worker_procs import WorkerProc, run_command

pytestmark = pytest.mark.django_db(transaction=True)

#: Tests about the broker's side (its restarts, an unreachable URL): the database plays no
#: part in what they check, and the relay's claims and fencing are covered on every
#: database by the others, so they run in the PostgreSQL pass only.
broker_side = pytest.mark.skipif(
    connections["default"].vendor != "postgresql",
    reason="broker-side behaviour: checked once, in the PostgreSQL pass",
)

LABEL = "outboxapp.Message"


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
def rabbit():
    reason = rabbit_down_reason()
    if reason:
        pytest.skip(reason)
    b = RabbitQueue()
    yield b
    b.close()


@pytest.fixture
def procs():
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.close()


def relay_proc(procs, broker, *args: str) -> WorkerProc:
    p = WorkerProc(
        LABEL,
        "--publisher",
        broker.publisher,
        "--url",
        broker.url,
        *args,
        command="taskclaim_relay",
    )
    procs.append(p)
    wait_for(
        lambda: "taskclaim relay" in p.stdout() or not p.alive(),
        timeout=30,
        what="relay startup line",
    )
    assert p.alive(), f"relay exited early:\n{p.stdout()}\n{p.stderr()}"
    return p


def write(topic: str, n: int, keys: int, start: int = 0) -> list[Message]:
    """``n`` messages over ``keys`` keys, interleaved; each payload names its key and
    its position within the key."""
    out = []
    for i in range(start, start + n):
        key = f"k{i % keys}"
        out.append(publish(topic, {"key": key, "i": i}, key=key))
    return out


def check_arrivals(deliveries, *, at_most_duplicates: int | None = None) -> Counter:
    """Every row arrived; duplicates are copies of a row (same idempotency key and
    payload); per key, first deliveries come in id order. Returns the copy counts."""
    rows = {m.idempotency_key: m for m in Message.objects.all()}
    copies = Counter(d.message_id for d in deliveries)
    assert set(copies) == set(rows), (
        f"missing {len(set(rows) - set(copies))}, unknown {len(set(copies) - set(rows))}"
    )
    for d in deliveries:
        row = rows[d.message_id]
        assert d.payload == row.payload
        assert d.key == row.key
    firsts: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for d in deliveries:
        if d.message_id not in seen:
            seen.add(d.message_id)
            firsts[d.key].append(rows[d.message_id].pk)
    for key, pks in firsts.items():
        assert pks == sorted(pks), f"key {key}: first deliveries out of id order"
    extra = sum(copies.values()) - len(copies)
    if at_most_duplicates is not None:
        assert extra <= at_most_duplicates, f"{extra} duplicates"
    return copies


# -- pure logic ---------------------------------------------------------------------


def test_rounds_hold_one_message_per_key_and_keep_each_keys_order():
    class M:
        def __init__(self, pk, key):
            self.pk, self.key = pk, key

    msgs = [M(1, "a"), M(2, "a"), M(3, "b"), M(4, "a"), M(5, "c"), M(6, "b")]
    out = rounds(msgs)
    assert [[m.pk for m in r] for r in out] == [[1, 3, 5], [2, 6], [4]]
    for r in out:
        assert len({m.key for m in r}) == len(r)


def test_key_hash_is_stable_and_partitions_cover_the_space():
    # SHA-256 based: the same on every machine and Python version (never hash()).
    assert key_hash("order-42") == 1006154071
    for n in (1, 3, 7, 64):
        ranges = [partition_range(p, n) for p in range(n)]
        assert ranges[0][0] == 0
        assert ranges[-1][1] == KEY_HASH_SPACE
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    with pytest.raises(ValueError, match="not in"):
        partition_range(3, 3)


# -- writing --------------------------------------------------------------------------


def test_publish_writes_a_ready_row_with_database_clock_and_unique_key():
    m = publish("orders", {"id": 1}, key="order-1", headers={"trace": "t1"})
    m.refresh_from_db()
    assert m.claim_state == "ready"
    assert m.created_at is not None
    assert m.key_hash == key_hash("order-1")
    assert len(m.idempotency_key) == 32
    default_key = publish("orders", {"id": 2})
    assert default_key.key == "orders"
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"), transaction.atomic():
        publish("orders", {}, idempotency_key=m.idempotency_key)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("", {}), {}, "topic"),
        (("t", {"x": object()}), {}, "JSON"),
        (("t", {"x": float("nan")}), {}, "JSON"),
        (("t", {}), {"key": ""}, "key"),
        (("t", {}), {"headers": {"a": 1}}, "headers"),
        (("t", {}), {"idempotency_key": "x" * 65}, "idempotency_key"),
    ],
)
def test_publish_refuses_bad_input_with_a_clear_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        publish(*args, **kwargs)
    assert Message.objects.count() == 0


def test_publish_refuses_a_model_that_is_not_an_outbox():
    with pytest.raises(ConfigurationError, match="not an outbox model"):
        publish("t", {}, model=Order)


# -- relaying to the brokers ----------------------------------------------------------


def test_rolled_back_messages_never_leave_and_committed_ones_arrive(broker):
    with transaction.atomic():
        Order.objects.create(number="kept")
        kept = write(broker.topic, 30, keys=3)

    class Boom(Exception):
        pass

    def change_then_fail() -> None:
        with transaction.atomic():
            Order.objects.create(number="rolled back")
            publish(broker.topic, {"ghost": True}, key="k0")
            raise Boom

    with pytest.raises(Boom):
        change_then_fail()
    assert Order.objects.count() == 1
    relay = Relay(Message, make_publisher(broker.publisher, broker.url), partitions=2)
    assert relay.run(burst=True) == 30
    assert Message.objects.done().count() == 30
    deliveries = broker.drain()
    assert {d.message_id for d in deliveries} == {m.idempotency_key for m in kept}
    assert not any("ghost" in d.payload for d in deliveries)
    check_arrivals(deliveries, at_most_duplicates=0)


def test_a_message_the_broker_rejects_for_good_fails_with_the_reason(rabbit):
    write(rabbit.topic, 3, keys=1)
    lost = publish("outbox-h7-no-such-queue", {"x": 1}, key="k0")
    write(rabbit.topic, 2, keys=1, start=3)
    relay = Relay(Message, make_publisher("rabbitmq", rabbit.url))
    relay.run(burst=True)
    lost.refresh_from_db()
    assert lost.claim_state == "failed"
    assert "unroutable" in lost.last_error
    assert Message.objects.done().count() == 5
    deliveries = rabbit.drain()
    assert len(deliveries) == 5
    assert lost.idempotency_key not in {d.message_id for d in deliveries}


class GatedPublisher:
    """A stand-in broker client whose publish_batch waits for a gate: it lets the test
    hold a relay between its claim and its completion."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.batches: list[list[str]] = []

    def connect(self) -> None:
        pass

    def publish_batch(self, messages) -> None:
        self.entered.set()
        assert self.gate.wait(30)
        self.batches.append([m.idempotency_key for m in messages])

    def close(self) -> None:
        pass


def test_a_relay_that_lost_its_partition_marks_nothing_published():
    write("t", 5, keys=1)
    slow = GatedPublisher()
    stale = Relay(Message, slow, lease=1, backoff=0.05)
    result: dict[str, int] = {}

    def run_stale() -> None:
        try:
            result["n"] = stale.run(burst=True)
        finally:
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=run_stale)
    thread.start()
    try:
        assert slow.entered.wait(30)
        lock = stale.locks[0]
        wait_for(lambda: not lock.held, timeout=10, what="the stale relay's lease to end")
        fresh_pub = GatedPublisher()
        fresh_pub.gate.set()
        fresh = Relay(Message, fresh_pub, lease=5)

        def taken_over() -> bool:
            fresh._hold_partitions()  # takes the partition over: releases the stale claims
            return 0 in fresh.locks

        wait_for(taken_over, timeout=10, what="the database to end the stale lease")
        assert Message.objects.processing().count() == 0
    finally:
        stale.stop()  # after this batch: it would otherwise take the partition back later
        slow.gate.set()
        thread.join(30)
    assert slow.batches  # it did publish (a duplicate to be) ...
    assert result["n"] == 0  # ... but its completion matched nothing
    assert Message.objects.done().count() == 0
    assert fresh.run(burst=True) == 5
    assert Message.objects.done().count() == 5
    assert [len(b) for b in fresh_pub.batches] == [1] * 5  # one key: one per round


def test_a_row_the_claim_skipped_holds_back_the_later_rows_of_its_key(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite claims take no row locks: a claim never skips a row there")
    a1 = publish("t", {"n": 1}, key="a")
    a2 = publish("t", {"n": 2}, key="a")
    b1 = publish("t", {"n": 3}, key="b")
    locked, finish = threading.Event(), threading.Event()

    def hold_a1() -> None:  # another transaction holds a1's row lock: SKIP LOCKED skips it
        try:
            with transaction.atomic():
                list(Message.objects.select_for_update().filter(pk=a1.pk))
                locked.set()
                finish.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_a1)
    thread.start()
    pub = GatedPublisher()
    pub.gate.set()
    relay = Relay(Message, pub)
    try:
        assert locked.wait(30)
        relay._hold_partitions()
        relay._drain(0)
    finally:
        finish.set()
        thread.join(30)
    assert pub.batches == [[b1.idempotency_key]]  # a2 waited for a1
    a2.refresh_from_db()
    assert a2.claim_state == "ready"
    relay.run(burst=True)
    sent = [k for batch in pub.batches for k in batch]
    assert sent == [b1.idempotency_key, a1.idempotency_key, a2.idempotency_key]


def test_fenced_completion_of_stale_rows_writes_nothing():
    write("t", 3, keys=3)
    rows = Message.objects.claim(3, lease=30)
    Message.objects.processing().release()
    assert len(complete_many(rows)) == 3
    assert Message.objects.done().count() == 0


# -- the command ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nope.Model", "--publisher", "rabbitmq", "--url", "amqp://x"], "no model 'nope.Model'"),
        (["testapp.Document", "--publisher", "rabbitmq", "--url", "amqp://x"], "not an outbox"),
        (
            [LABEL, "--publisher", "rabbitmq", "--url", "amqp://guest:guest@127.0.0.1:1/%2F"],
            "unreachable",
        ),
        (
            [LABEL, "--publisher", "nats", "--url", "nats://127.0.0.1:1", "--timeout", "1"],
            "unreachable",
        ),
        (
            [LABEL, "--publisher", "nats", "--url", "nats://127.0.0.1:1", "--timeout", "0"],
            "--timeout",
        ),
        (
            [LABEL, "--publisher", "rabbitmq", "--url", "amqp://x", "--partitions", "0"],
            "--partitions",
        ),
        (
            [
                LABEL,
                "--publisher",
                "rabbitmq",
                "--url",
                "amqp://x",
                "--partitions",
                "2",
                "--max-partitions",
                "3",
            ],
            "--max-partitions must be from 1 to 2",
        ),
        ([LABEL, "--publisher", "kafka", "--url", "x"], "is not one of rabbitmq, nats"),
    ],
)
@pytest.mark.slow
def test_command_errors_are_one_clear_line(args, expected):
    if expected == "unreachable" and connections["default"].vendor != "postgresql":
        pytest.skip("broker-side behaviour: checked once, in the PostgreSQL pass")
    if expected != "unreachable" and connections["default"].vendor != "sqlite":
        pytest.skip("a command line refused before any query: checked once, in the SQLite pass")
    if expected == "unreachable" and rabbit_down_reason() and "rabbitmq" in args:
        pytest.skip(rabbit_down_reason())
    done = run_command("taskclaim_relay", *args, timeout=60)
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) <= 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partitions": 0}, "partitions must be > 0"),
        ({"partitions": 4097}, "partitions must be from 1 to 4096"),
        ({"partitions": 2, "max_partitions": 3}, "max_partitions must be from 1 to 2"),
        ({"batch": 1.5}, "batch must be a whole number"),
        ({"lease": 0.5}, "lease must be from 1 to 3600"),
        ({"poll": float("nan")}, "poll must be a finite number"),
        ({"backoff": 2.0, "backoff_max": 1.0}, "backoff_max must be from 2 to 3600"),
    ],
)
def test_relay_arguments_are_checked_against_the_options_table(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Relay(Message, GatedPublisher(), **kwargs)


def test_the_command_flags_are_the_options_table():
    from django_taskclaim.config.commandline import parsed_values
    from django_taskclaim.management.commands.taskclaim_relay import OPTIONS, Command
    from django_taskclaim.outbox.options import RELAY_OPTIONS

    parser = Command().create_parser("manage.py", "taskclaim_relay")
    flags = {a.dest: a.default for a in parser._actions}
    given = parsed_values(
        vars(parser.parse_args([LABEL, "--publisher", "nats", "--url", "nats://x"])), OPTIONS
    )
    for option in RELAY_OPTIONS:
        assert (option.name in flags) == bool(option.flags), option.name
        if option.flags:
            assert given[option.name] == option.default


def test_the_timeout_option_reaches_the_publisher(monkeypatch):
    from django.core.management import CommandError, call_command

    from django_taskclaim.outbox import runner

    made = []

    def refuse(name, url, **options):
        made.append((name, options))
        raise PublishError("refused")

    monkeypatch.setattr(runner, "make_publisher", refuse)
    with pytest.raises(CommandError, match="unreachable: refused"):
        call_command("taskclaim_relay", LABEL, "--publisher", "nats", "--url", "nats://x",
                     "--timeout", "2.5")  # fmt: skip
    with pytest.raises(CommandError, match="unreachable"):
        call_command("taskclaim_relay", LABEL, "--publisher", "rabbitmq", "--url", "amqp://x")
    assert made == [("nats", {"timeout": 2.5}), ("rabbitmq", {"timeout": 10.0, "exchange": ""})]


def test_sigterm_stops_the_relay_gracefully(procs, broker):
    write(broker.topic, 20, keys=4)
    p = relay_proc(procs, broker)
    wait_for(lambda: Message.objects.done().count() == 20, timeout=60, what="all published")
    p.signal(signal.SIGTERM)
    assert p.wait(30) == 0, p.stderr()
    assert "stopped: 20 message(s) published" in p.stdout()
    check_arrivals(broker.drain(), at_most_duplicates=0)


# -- crashes and restarts -------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_mid_batch_then_takeover_delivers_everything_in_order(procs, broker):
    n, keys, batch = 2000, 20, 200
    write(broker.topic, n, keys=keys)
    first = relay_proc(procs, broker, "--partitions", "4", "--batch", str(batch), "--lease", "2")

    def frozen_mid_batch() -> bool:
        """Stop the relay (SIGSTOP) and keep it stopped if it holds a batch: a batch seen
        in flight then cannot finish before the kill (it could between a look and a kill
        while the relay ran)."""
        first.signal(signal.SIGSTOP)
        if Message.objects.done().count() >= 300 and Message.objects.processing().exists():
            return True
        first.signal(signal.SIGCONT)
        return False

    wait_for(frozen_mid_batch, timeout=60, what="the relay mid-batch")
    first.kill()
    assert Message.objects.processing().exists(), "the relay was not killed mid-batch"
    assert Message.objects.done().count() < n
    # Two relays share the partitions; they take the dead one's over after its lease.
    for _ in range(2):
        relay_proc(
            procs,
            broker,
            "--partitions",
            "4",
            "--max-partitions",
            "2",
            "--batch",
            "50",
            "--lease",
            "2",
        )
    wait_for(lambda: Message.objects.done().count() == n, timeout=120, what="every message done")
    assert Message.objects.processing().count() == 0
    # Duplicates only for the killed relay's rows in flight (at most one batch).
    copies = check_arrivals(broker.drain(), at_most_duplicates=batch)
    assert len(copies) == n


@pytest.mark.slow
@broker_side
def test_broker_restart_while_the_relay_runs_loses_nothing(procs, broker):
    write(broker.topic, 200, keys=10)
    p = relay_proc(procs, broker, "--lease", "5", "--batch", "50")
    wait_for(lambda: Message.objects.done().count() == 200, timeout=60, what="first wave")

    def while_down() -> None:
        write(broker.topic, 200, keys=10, start=200)
        wait_for(
            lambda: "publish failed" in p.stderr() or "cannot reach" in p.stderr(),
            timeout=60,
            what="the relay to notice the broker is down",
        )
        assert Message.objects.done().count() == 200

    type(broker).restart(while_down)
    wait_for(lambda: Message.objects.done().count() == 400, timeout=120, what="second wave")
    assert p.alive()
    check_arrivals(broker.drain(), at_most_duplicates=50)
    assert Message.objects.failed().count() == 0


def test_publishers_raise_publish_error_when_the_broker_is_unreachable():
    pytest.importorskip("pika")
    pub = make_publisher("rabbitmq", "amqp://guest:guest@127.0.0.1:1/%2F")
    with pytest.raises(PublishError, match="cannot reach RabbitMQ"):
        pub.connect()
    assert issubclass(MessagesRejected, PublishError)
    with pytest.raises(ValueError, match="unknown publisher"):
        make_publisher("smtp", "x")


# -- no password in any message ---------------------------------------------------------

PASSWORD = "S3cr3t-Passw0rd"
#: The brokers the tests use, each at a port nothing listens on (a refused connection),
#: with a password in the URL.
SECRET_URLS = {
    "rabbitmq": f"amqp://relay:{PASSWORD}@127.0.0.1:1/%2F",
    "nats": f"nats://relay:{PASSWORD}@127.0.0.1:1",
}


def client_library(publisher: str) -> None:
    pytest.importorskip({"rabbitmq": "pika", "nats": "nats"}[publisher])


@pytest.mark.parametrize("publisher", sorted(SECRET_URLS))
def test_a_refused_broker_connection_never_shows_the_password(publisher, caplog):
    from django_taskclaim.outbox.options import RELAY_OPTIONS
    from django_taskclaim.outbox.runner import open_relay

    client_library(publisher)
    values = {o.name: o.default for o in RELAY_OPTIONS} | {"timeout": 2.0}
    caplog.set_level("DEBUG")
    with pytest.raises(ConfigurationError) as raised:
        open_relay(Message, publisher, SECRET_URLS[publisher], values)
    shown = str(raised.value)
    assert "unreachable" in shown
    assert "relay:***@127.0.0.1:1" in shown  # who and where stay readable
    assert raised.value.__suppress_context__  # no traceback of the client's error either
    messages = [shown, *(r.getMessage() for r in caplog.records)]
    assert not [m for m in messages if PASSWORD in m]


@pytest.mark.parametrize("publisher", sorted(SECRET_URLS))
@pytest.mark.parametrize("given", ["--url", "environment"])
def test_the_relay_command_never_prints_the_password(publisher, given):
    client_library(publisher)
    url = SECRET_URLS[publisher]
    args = [LABEL, "--publisher", publisher, "--timeout", "2", "-v", "3"]
    env = {}
    if given == "--url":
        args += ["--url", url]
    else:
        env["TASKCLAIM_RELAY_URL"] = url  # not on the command line: not in ps
    done = run_command("taskclaim_relay", *args, env=env, timeout=60)
    assert done.returncode != 0
    assert "unreachable" in done.stderr, done.stderr
    assert "relay:***@127.0.0.1:1" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr


def test_the_broker_url_comes_from_the_option_the_environment_or_the_setting(monkeypatch, settings):
    from django.core.management import CommandError

    from django_taskclaim.management.commands.taskclaim_relay import ENV_URL, broker_url

    monkeypatch.delenv(ENV_URL, raising=False)
    with pytest.raises(
        CommandError, match=f"no broker URL: set the environment variable {ENV_URL}"
    ):
        broker_url(None)
    settings.TASKCLAIM_RELAY_URL = "nats://from-settings"
    assert broker_url(None) == "nats://from-settings"
    monkeypatch.setenv(ENV_URL, "nats://from-env")
    assert broker_url(None) == "nats://from-env"
    assert broker_url("nats://given") == "nats://given"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("amqp://relay:pw@h:5672/%2F", "amqp://relay:***@h:5672/%2F"),
        ("at nats://u:p@ss@h:4222 down", "at nats://u:***@h:4222 down"),
        ("postgres://:pw@h/db", "postgres://:***@h/db"),
        ("host=h password=pw user=u", "host=h password=*** user=u"),
        ("PASSWORD = 'a b' port=1", "PASSWORD = *** port=1"),
        ("amqp://guest@h/ and http://h/a:b@c", "amqp://guest@h/ and http://h/a:b@c"),
    ],
)
def test_redact_hides_the_password_and_keeps_the_rest(text, shown):
    from django_taskclaim.redact import redact

    assert redact(text) == shown
