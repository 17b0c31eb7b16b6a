"""Broker fixtures of the outbox tests: the RabbitMQ and NATS JetStream on this machine.

Each test gets its own queue (RabbitMQ) or stream (NATS), reads back what arrived, and
removes it afterwards. ``*_down_reason()`` says why a broker cannot be used (not
answering, client library missing), for a visible skip.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

from tests.support.helpers import wait_for

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
NATS_URL = "nats://127.0.0.1:4222"
NATS_START = [
    "start-stop-daemon",
    "--start",
    "--oknodo",
    "--background",
    "--exec",
    "/usr/sbin/nats-server",
    "--",
    "-a",
    "127.0.0.1",
    "-p",
    "4222",
    "-js",
    "-sd",
    "/var/lib/nats-server",
    "-l",
    "/var/log/nats-server.log",
]
NATS_STOP = [
    "start-stop-daemon",
    "--stop",
    "--oknodo",
    "--retry",
    "20",
    "--exec",
    "/usr/sbin/nats-server",
]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def rabbit_down_reason() -> str | None:
    try:
        import pika  # noqa: F401
    except ImportError:
        return "pika is not installed (pip install --group test)"
    if not port_open(5672):
        return "RabbitMQ does not answer at 127.0.0.1:5672"
    return None


def nats_down_reason() -> str | None:
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install --group test)"
    if not port_open(4222):
        return "NATS does not answer at 127.0.0.1:4222"
    return None


@dataclass
class Delivery:
    """One message as the broker handed it back."""

    message_id: str
    key: str
    payload: Any


class RabbitQueue:
    """A durable queue ``outbox-h7-<random>``; the topic to publish to is its name."""

    url = RABBIT_URL
    publisher = "rabbitmq"

    def __init__(self) -> None:
        import pika

        self.pika = pika
        self.name = f"outbox-h7-{uuid.uuid4().hex[:12]}"
        self.topic = self.name
        self.received: list[Delivery] = []
        with self._channel() as (_conn, channel):
            channel.queue_declare(self.name, durable=True)

    def _channel(self) -> Any:
        pika = self.pika

        class _Ctx:
            def __enter__(ctx) -> Any:
                ctx.conn = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
                return ctx.conn, ctx.conn.channel()

            def __exit__(ctx, *exc: Any) -> None:
                if ctx.conn.is_open:
                    ctx.conn.close()

        return _Ctx()

    def drain(self) -> list[Delivery]:
        """Consume (and acknowledge) everything in the queue now; return all consumed so
        far, in queue order."""
        with self._channel() as (_conn, channel):
            while True:
                method, props, body = channel.basic_get(self.name, auto_ack=True)
                if method is None:
                    break
                self.received.append(
                    Delivery(
                        props.message_id, (props.headers or {}).get("Outbox-Key"), json.loads(body)
                    )
                )
        return self.received

    def close(self) -> None:
        try:
            with self._channel() as (_conn, channel):
                channel.queue_delete(self.name)
        except Exception:
            pass

    @staticmethod
    def restart(while_down: Any) -> None:
        """``rabbitmqctl stop_app``, call ``while_down()``, ``start_app`` (always)."""
        ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
        subprocess.run([ctl, "stop_app"], check=True, capture_output=True, timeout=120)
        try:
            while_down()
        finally:
            subprocess.run([ctl, "start_app"], check=True, capture_output=True, timeout=120)
        wait_for(lambda: port_open(5672), timeout=60, what="RabbitMQ back")


class NatsStream:
    """A file-backed JetStream stream capturing ``outbox-h7.<random>.>``; the topic to
    publish to is ``outbox-h7.<random>.events``."""

    url = NATS_URL
    publisher = "nats"

    def __init__(self) -> None:
        token = uuid.uuid4().hex[:12]
        self.name = f"OUTBOX_H7_{token}"
        self.topic = f"outbox-h7.{token}.events"
        self._subjects = [f"outbox-h7.{token}.>"]
        asyncio.run(self._create())

    async def _js(self) -> tuple[Any, Any]:
        import nats

        nc = await nats.connect(NATS_URL, allow_reconnect=False, connect_timeout=5)
        return nc, nc.jetstream(timeout=10)

    async def _create(self) -> None:
        nc, js = await self._js()
        try:
            await js.add_stream(name=self.name, subjects=self._subjects, storage="file")
        finally:
            await nc.close()

    def drain(self) -> list[Delivery]:
        """Every message in the stream, in stream order."""

        async def read() -> list[Delivery]:
            nc, js = await self._js()
            try:
                info = await js.stream_info(self.name)
                out = []
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    msg = await js.get_msg(self.name, seq)
                    headers = msg.headers or {}
                    out.append(
                        Delivery(
                            headers.get("Nats-Msg-Id"),
                            headers.get("Outbox-Key"),
                            json.loads(msg.data),
                        )
                    )
                return out
            finally:
                await nc.close()

        return asyncio.run(read())

    def close(self) -> None:
        async def delete() -> None:
            nc, js = await self._js()
            try:
                await js.delete_stream(self.name)
            finally:
                await nc.close()

        try:
            asyncio.run(delete())
        except Exception:
            pass

    @staticmethod
    def restart(while_down: Any) -> None:
        """Stop nats-server, call ``while_down()``, start it again (always)."""
        subprocess.run(NATS_STOP, check=True, capture_output=True, timeout=60)
        try:
            wait_for(lambda: not port_open(4222), timeout=30, what="NATS down")
            while_down()
        finally:
            subprocess.run(NATS_START, check=True, capture_output=True, timeout=60)
        wait_for(lambda: port_open(4222), timeout=60, what="NATS back")


BROKERS = {"rabbitmq": (RabbitQueue, rabbit_down_reason), "nats": (NatsStream, nats_down_reason)}
