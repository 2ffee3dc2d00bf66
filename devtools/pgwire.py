"""Round trips between PostgreSQL clients and a server, counted on the wire.

The server's statement log cannot count round trips: psycopg's pipeline mode
(`cursor.executemany`, `Connection.pipeline()`) sends many statements before
it waits for any answer, and the server logs each apart. So `Relay` sits
between the clients and the server, a loopback TCP relay (127.0.0.1, a free
port), and counts per relayed connection the times the client starts sending
after the server has answered (or sends its first bytes, but not a Terminate
alone): that is how often the client waits for the server. What the server sends unasked
(NotificationResponse, ParameterStatus, NoticeResponse: a LISTEN connection
gets them) is not an answer.

Both directions are split into protocol messages (a type byte, then an int32
big-endian length that counts itself; the client's start-up packet, and an
SSLRequest or GSSENCRequest before it, has no type byte), keeping only the
header of a message a TCP segment cuts: bodies are skipped as they pass. The
bytes are not decrypted, so clients connect with `sslmode=disable`. A server
that refuses encryption answers a request for it with the one byte 'N', which
is understood; one that accepts makes the rest unreadable (`Session.opaque`).
"""

from __future__ import annotations

import collections
import contextlib
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

UNASKED = frozenset("ASN")
"""Server messages that answer nothing: NotificationResponse, ParameterStatus,
NoticeResponse."""

NEGOTIATION_CODES = frozenset({80877103, 80877104})
"""SSLRequest and GSSENCRequest: the server answers each with a single byte."""

NEGOTIATION_ANSWER = "encryption?"
"""What `MessageSplitter.feed` reports for that byte (no message type is
longer than one character, so this names no message)."""

READY = "Z"
"""ReadyForQuery: its first arrival ends the connection's start-up."""

TERMINATE = "X"
"""The client's last message: nothing answers it, so it is no round trip."""

_CHUNK = 65536


class MessageSplitter:
    """One direction's byte stream, split into messages across any cuts.

    `untyped`: the next message is a start-up packet (int32 length, int32
    code, no type byte), as the client's first is. `peer`: the splitter of
    the other direction, told when a request for encryption makes its next
    message a single byte."""

    def __init__(self, *, untyped: bool, peer: MessageSplitter | None = None) -> None:
        self.untyped = untyped
        self.one_byte = False
        self.opaque = False
        self._peer = peer
        self._header = bytearray()
        self._type = ""
        self._remaining = 0

    def feed(self, data: bytes) -> tuple[set[str], list[str]]:
        """(touched, started): the types of the messages data holds any byte
        of, one continued from the last chunk included; and the types of those
        whose header ends in data, in order, each message once. A start-up
        packet's type is ''."""
        touched: set[str] = set()
        started: list[str] = []
        view = memoryview(data)
        while view and not self.opaque:
            if self._remaining:
                step = min(self._remaining, len(view))
                self._remaining -= step
                view = view[step:]
                touched.add(self._type)
            elif self.one_byte:
                self.one_byte = False
                self.opaque = view[0] != ord("N")
                view = view[1:]
                touched.add(NEGOTIATION_ANSWER)
            else:
                view = self._header_bytes(view, touched, started)
        return touched, started

    def _header_bytes(self, view: memoryview, touched: set[str], started: list[str]) -> memoryview:
        """Take what view holds of the next header; once it is whole, note
        the message and how much body follows. Returns the rest of view."""
        if not self._header:
            self._type = "" if self.untyped else chr(view[0])
        need = 8 if self.untyped else 5
        take = min(need - len(self._header), len(view))
        self._header += view[:take]
        touched.add(self._type)
        if len(self._header) == need:
            if self.untyped:
                length, code = struct.unpack("!ii", self._header)
                self._untyped_packet(code)
            else:
                length = struct.unpack("!i", self._header[1:])[0] + 1
            self._remaining = max(0, length - need)
            self._header.clear()
            started.append(self._type)
        return view[take:]

    def _untyped_packet(self, code: int) -> None:
        """After a request for encryption comes the server's one-byte answer,
        then another start-up packet; after any other, typed messages."""
        self.untyped = code in NEGOTIATION_CODES
        if self.untyped and self._peer is not None:
            self._peer.one_byte = True


@dataclass
class Session:
    """What one relayed connection did. `startup_round_trips`: those of
    them before the server's first ReadyForQuery (start-up and
    authentication), counted in `round_trips` too."""

    round_trips: int = 0
    startup_round_trips: int = 0
    client_messages: collections.Counter[str] = field(default_factory=collections.Counter)
    opaque: bool = False
    _answered: bool = True
    _ready: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def from_client(self, touched: set[str], started: list[str]) -> None:
        """A client chunk: a new round trip if the server had answered."""
        with self._lock:
            if touched - {TERMINATE} and self._answered:
                self.round_trips += 1
                self.startup_round_trips += not self._ready
                self._answered = False
            self.client_messages.update(kind for kind in started if kind)

    def from_server(self, touched: set[str], started: list[str]) -> None:
        """A server chunk: an answer unless all it holds came unasked."""
        with self._lock:
            if touched - UNASKED:
                self._answered = True
            self._ready = self._ready or READY in started


def _pump(
    source: socket.socket,
    sink: socket.socket,
    splitter: MessageSplitter,
    note: Callable[[set[str], list[str]], None],
) -> None:
    """Forward source to sink until source ends, noting each chunk before it
    is forwarded (so an answer is noted before the client can react to it);
    then end sink's writing side, as source's ended."""
    with contextlib.suppress(OSError):
        while data := source.recv(_CHUNK):
            note(*splitter.feed(data))
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class _Handler(socketserver.BaseRequestHandler):
    """One client connection: a connection to the server, one thread per direction."""

    server: _Listener

    def handle(self) -> None:
        session = self.server.relay.opened()
        answers = MessageSplitter(untyped=False)
        requests = MessageSplitter(untyped=True, peer=answers)
        client: socket.socket = self.request
        with socket.create_connection(self.server.relay.upstream) as upstream:
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            back = threading.Thread(
                target=_pump, args=(upstream, client, answers, session.from_server), daemon=True
            )
            back.start()
            _pump(client, upstream, requests, session.from_client)
            back.join()
        session.opaque = answers.opaque


class _Listener(socketserver.ThreadingTCPServer):
    relay: Relay


class Relay:
    """A loopback relay to the server at host:port, for a `with` block:
    connect to 127.0.0.1:`port` instead. `sessions` holds one Session per
    connection, in the order they were accepted; on leaving the block every
    connection has ended (the listener waits for them)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.sessions: list[Session] = []
        self._lock = threading.Lock()
        self._listener = _Listener(("127.0.0.1", 0), _Handler)
        self._listener.relay = self
        self._thread = threading.Thread(target=self._listener.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return str(self._listener.server_address[0])

    @property
    def port(self) -> int:
        return int(self._listener.server_address[1])

    def opened(self) -> Session:
        session = Session()
        with self._lock:
            self.sessions.append(session)
        return session

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._listener.shutdown()
        self._listener.server_close()
        self._thread.join()
