"""A loopback TCP proxy in front of a PostgreSQL server that injects network faults on demand.

The nemesis, and any implementation whose DSN can point at it (`FaultProxy.dsn_through`), meets
faults a real network produces and a local socket never does: an answer lost after the server
committed (`lose_next_answer`), a connection reset while a request is in flight
(`reset_next_request`), late answers (`delay`), and a `blackhole` that holds every byte a while.
Each is armed from any thread, acts on whichever connection meets it first, and is counted
(`counts`). On 127.0.0.1 only, the proxy pumps bytes both ways, two threads a connection, and
reads just enough of the wire protocol to group the server's messages into *responses*, each
ending with a ReadyForQuery, forwarded whole so that a fault acts on one as a unit; what comes
while no request is outstanding (a notification, what a Flush fetches) is forwarded at once and
never faulted, and a COPY's response as it arrives. A stream it cannot read (SSL or GSS
encryption) is passed through: only `blackhole` acts on it. Every wait is bounded, and `close()`
joins every thread within about two seconds. docs/nemesis.md lists the faults.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import math
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, Self

from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["THREAD_PREFIX", "FaultProxy"]

THREAD_PREFIX = "leaseproof-proxy"  # every thread the proxy starts has a name that starts with this

_TICK = 0.25  # seconds: the timeout of every socket operation, after which a thread checks whether to stop
_CONNECT_TIMEOUT = 10.0  # seconds to reach the server for one client connection
_JOIN_TIMEOUT = 2.0  # seconds close() waits, in all, for the proxy's threads
_CHUNK = 65536

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_MAX_STARTUP_LENGTH = 10000  # PostgreSQL's limit on a start-up message (MAX_STARTUP_PACKET_LENGTH)
_TLS_HANDSHAKE = 0x16  # the first byte of a TLS record that opens a handshake (direct SSL negotiation)

_QUERY, _SYNC, _FUNCTION_CALL, _PARSE = b"Q"[0], b"S"[0], b"F"[0], b"P"[0]
_COMMAND_COMPLETE, _READY_FOR_QUERY = b"C"[0], b"Z"[0]
_COPY_IN_RESPONSE, _COPY_BOTH_RESPONSE = b"G"[0], b"W"[0]
_IDLE = b"I"[0]

Address = str | tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]


class Observer(Protocol):
    """Sees each connection's requests before they go to the server, and the end of each of its
    responses as it comes back (`FaultProxy.observer`; conformance/harness/interleave.py orders
    the requests of several connections by it). Called on the connection's own threads; a call
    may wait, bounded, and the proxy's faults act after it."""

    def before_requests(self, connection: int, messages: bytes, requests: int) -> None:
        """`messages` (whole protocol messages) end `requests` requests (a Query, a Sync, a
        FunctionCall each) of connection number `connection`, and are about to be sent."""

    def after_response(self, connection: int) -> None:
        """A response of `connection` came back whole (its ReadyForQuery), before it is forwarded."""


def _first(value: object) -> str:
    """The first of a libpq list of hosts or ports ("a,b" names two), or ""."""
    return str(value or "").split(",")[0].strip()


def _upstream(dsn: str) -> list[tuple[socket.AddressFamily, Address]]:
    """Where the server the DSN names listens: a unix socket's path, or the TCP addresses of its host."""
    params = conninfo_to_dict(dsn)
    host = _first(params.get("host")) or os.environ.get("PGHOST", "").split(",")[0].strip()
    hostaddr = _first(params.get("hostaddr")) or os.environ.get("PGHOSTADDR", "").split(",")[0].strip()
    port_text = _first(params.get("port")) or os.environ.get("PGPORT", "").split(",")[0].strip() or "5432"
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the DSN's port {port_text!r} is not a number") from None
    if hostaddr:
        host = hostaddr
    elif host.startswith("/"):
        return [(socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}"))]
    elif host.startswith("@"):  # a socket in Linux's abstract namespace, as libpq reads "@name"
        return [(socket.AF_UNIX, f"\0{host[1:]}/.s.PGSQL.{port}")]
    if not host:
        raise ValueError("the DSN names no host (nor does PGHOST): name the server's host or socket folder")
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, address) for family, _, _, _, address in found]


class _Connection:
    """One client connection and the proxy's own connection to the server for it."""

    def __init__(self, number: int, client: socket.socket) -> None:
        self.number = number
        self.client = client
        self.upstream: socket.socket | None = None
        self.ended = threading.Event()
        # Held around each send to the client and around closing it, so that a send never meets a closed socket.
        self.client_lock = threading.Lock()
        self.client_closed = False
        # The rest is guarded by the proxy's lock.
        self.threads_left = 1
        self.answers_expected = 0  # one-byte answers the server owes (to SSLRequest, GSSENCRequest)
        self.opaque = False  # the stream is not read: encrypted, or not the protocol
        self.requests = 0  # Query, Sync and FunctionCall messages forwarded: each gets one ReadyForQuery
        self.held_generation = -1  # the last blackhole this connection was counted as held by


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of the PostgreSQL server a DSN names, which injects faults on demand.

    Use it as a context manager, or call `start()` and `close()`. Clients connect to
    `dsn_through(dsn)`. The faults (`lose_next_answer`, `reset_next_request`, `delay`,
    `blackhole`) can be armed from any thread; `counts` says how many of each fired
    ("lose-answer", "reset", "delayed": responses delayed, "blackholed": connections held,
    each once per `blackhole` call), and `connections` how many clients connected.
    """

    def __init__(self, dsn: str) -> None:
        """A proxy in front of the server `dsn` names: its unix socket when its host is a folder
        (`host=/some/dir port=5432` is `/some/dir/.s.PGSQL.5432`), else its host (or hostaddr)
        and port over TCP, port 5432 by default. A host name is resolved here, once; of a list
        of hosts or ports, the first is used. The proxy listens at once (its port is known), and
        accepts connections after `start()`. Raises ValueError if the DSN names no host (nor does PGHOST)
        or a port that is not a number, and OSError if its host name does not resolve."""
        self._targets = _upstream(dsn)
        self._target_dsn = dsn
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified on close, on a connection's end, on a blackhole
        self._stopping = False
        self._started = False
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._open: set[_Connection] = set()
        self._accepted = 0
        self._lose_armed = False
        self._reset_armed = False
        self._delay_seconds = 0.0
        self._delay_until = 0.0
        self._blackhole_until = 0.0
        self._blackhole_generation = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.observer: Observer | None = None  # set before `start()`: it sees every connection
        # Set before `start()`: the text of every statement a client sends (a Query's, a Parse's) is
        # replaced by what this makes of it (`rewritten`), before anything else sees it.
        self.rewrite: Callable[[str], str] | None = None
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(128)
            self._listener.settimeout(_TICK)
        except OSError:
            self._listener.close()
            raise
        host, port = self._listener.getsockname()
        self._address: tuple[str, int] = (str(host), int(port))
        self._port = int(port)

    # -- the proxy's life ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on, on 127.0.0.1."""
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """The address the proxy's socket is bound to: ("127.0.0.1", port)."""
        return self._address

    @property
    def connections(self) -> int:
        """How many client connections the proxy accepted."""
        with self._lock:
            return self._accepted

    def dsn_through(self, dsn: str) -> str:
        """`dsn` with its host and port replaced by the proxy's (host=127.0.0.1), and with SSL and GSS
        encryption off (sslmode=disable, gssencmode=disable): the proxy reads only plain streams."""
        params = conninfo_to_dict(dsn)
        for key in ("hostaddr", "sslnegotiation"):
            params.pop(key, None)
        params.update(host="127.0.0.1", port=str(self._port), sslmode="disable", gssencmode="disable")
        return make_conninfo("", **params)

    def direct(self, dsn: str) -> str:
        """`dsn`, a connection string through this proxy (`dsn_through`'s, or one a client built
        from it), pointed at the server itself again: the host, port and encryption settings of
        the DSN the proxy was made for. For a client that must not meet the faults."""
        target = conninfo_to_dict(self._target_dsn)
        params = conninfo_to_dict(dsn)
        for key in ("host", "hostaddr", "port", "sslmode", "gssencmode", "sslnegotiation"):
            params.pop(key, None)
            if key in target:
                params[key] = target[key]
        return make_conninfo("", **params)

    def start(self) -> Self:
        """Start accepting connections (on a thread of the proxy's own); returns the proxy."""
        with self._lock:
            if self._started or self._stopping:
                raise RuntimeError("a FaultProxy starts once, and not after close()")
            self._started = True
            self._start_thread(self._accept_loop, "accept")
        return self

    def close(self) -> None:
        """Stop accepting, end every open connection (client and server side), cut short every delay and
        blackhole, and join every thread the proxy started (waiting about two seconds at most). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._stopping = True
            connections = list(self._open)
            self._changed.notify_all()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() at once (its timeout is the backstop)
        for conn in connections:
            self._end(conn)
        deadline = time.monotonic() + _JOIN_TIMEOUT
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # -- the faults ------------------------------------------------------------------------------------------

    def lose_next_answer(self) -> None:
        """The next response that holds a CommandComplete and ends with ReadyForQuery status 'I' (idle:
        the server committed the work, an autocommit statement's or a COMMIT's) is not forwarded: the
        proxy closes that client connection and its connection to the server instead. Fires once."""
        with self._lock:
            self._lose_armed = True

    def reset_next_request(self) -> None:
        """The next Query or Sync (the end of an extended-protocol request) a client sends is forwarded to
        the server; then the proxy resets the client connection (a TCP RST: SO_LINGER 0 and close) and closes
        its connection to the server. The request may or may not take effect; its answer never comes.
        Fires once."""
        with self._lock:
            self._reset_armed = True

    def delay(self, seconds: float, for_seconds: float) -> None:
        """For the next `for_seconds`, every response whose ReadyForQuery (during a COPY, whose first part)
        reaches the proxy is forwarded `seconds` late. Replaces any delay armed before; a response already waiting
        keeps its delay, unless the connection ends or the proxy closes."""
        _check_duration("seconds", seconds)
        _check_duration("for_seconds", for_seconds)
        with self._lock:
            self._delay_seconds = seconds
            self._delay_until = time.monotonic() + for_seconds

    def blackhole(self, for_seconds: float) -> None:
        """For the next `for_seconds`, nothing is forwarded in either direction, on any connection: the
        bytes are held, not dropped, and then forwarded in order. A side's close is held like its bytes (it
        reaches the other side after them); a connection the proxy ends meanwhile (by `close()`, or a fault)
        drops what it held. Replaces any blackhole armed before (`blackhole(0)` ends one at once)."""
        _check_duration("for_seconds", for_seconds)
        with self._lock:
            self._blackhole_until = time.monotonic() + for_seconds
            self._blackhole_generation += 1
            self._changed.notify_all()

    def disarm(self) -> None:
        """Cancel what is armed and has not fired (a lost answer, a reset) and end any delay or
        blackhole now."""
        with self._lock:
            self._lose_armed = self._reset_armed = False
            self._delay_until = self._blackhole_until = 0.0
            self._blackhole_generation += 1
            self._changed.notify_all()

    # -- threads ---------------------------------------------------------------------------------------------

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        """Start a thread of the proxy's (the caller holds the lock and has checked `_stopping`)."""
        self._threads = [thread for thread in self._threads if thread.is_alive()]
        thread = threading.Thread(target=target, name=f"{THREAD_PREFIX}-{self._port}-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                with self._lock:
                    if self._stopping:
                        return
                    self._changed.wait(_TICK)  # out of descriptors, say: try again in a moment
                continue
            with self._lock:
                if self._stopping:
                    client.close()
                    return
                self._accepted += 1
                try:
                    client.settimeout(_TICK)
                    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn = _Connection(self._accepted, client)
                except OSError:  # reset by the client already
                    client.close()
                    continue
                self._open.add(conn)
                self._start_thread(functools.partial(self._client_to_server, conn), f"{conn.number}-up")

    def _end(self, conn: _Connection) -> None:
        """End a connection: wake both its threads, which then stop (the last closes its sockets)."""
        conn.ended.set()
        with self._lock:
            self._changed.notify_all()
        with conn.client_lock, contextlib.suppress(OSError):
            if not conn.client_closed:
                conn.client.shutdown(socket.SHUT_RDWR)
        if conn.upstream is not None:
            with contextlib.suppress(OSError):
                conn.upstream.shutdown(socket.SHUT_RDWR)

    def _thread_done(self, conn: _Connection) -> None:
        """A connection's thread stops; the last one closes the connection's sockets."""
        self._end(conn)
        with self._lock:
            conn.threads_left -= 1
            last = conn.threads_left == 0
            if last:
                self._open.discard(conn)
        if last:
            with conn.client_lock:
                conn.client_closed = True
                conn.client.close()
            if conn.upstream is not None:
                conn.upstream.close()

    def _connect(self, conn: _Connection) -> socket.socket | None:
        """The proxy's connection to the server, or None if it cannot be had in time (or the connection ended)."""
        deadline = time.monotonic() + _CONNECT_TIMEOUT
        for family, address in self._targets:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                error = sock.connect_ex(address)
                with selectors.DefaultSelector() as selector:
                    selector.register(sock, selectors.EVENT_WRITE)
                    while error == errno.EINPROGRESS:
                        remaining = deadline - time.monotonic()
                        if conn.ended.is_set() or remaining <= 0:
                            break
                        if selector.select(min(_TICK, remaining)):
                            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error == 0 and not conn.ended.is_set():
                    sock.settimeout(_TICK)
                    if family != socket.AF_UNIX:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return sock
            except OSError:
                pass
            sock.close()
        return None

    # -- client to server ------------------------------------------------------------------------------------

    def _client_to_server(self, conn: _Connection) -> None:
        try:
            upstream = self._connect(conn)
            if upstream is None:
                return  # _thread_done closes the client at once
            conn.upstream = upstream
            with self._lock:
                if self._stopping:
                    return
                conn.threads_left += 1
                self._start_thread(functools.partial(self._server_to_client, conn), f"{conn.number}-down")
            self._pump_up(conn, upstream)
        finally:
            self._thread_done(conn)

    def _pump_up(self, conn: _Connection, upstream: socket.socket) -> None:
        buffer = bytearray()
        startup = True
        while not conn.ended.is_set():
            try:
                data = conn.client.recv(_CHUNK)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            buffer += data
            out = bytearray()
            reset = False
            requests = 0  # requests that `out` ends
            while buffer:
                with self._lock:
                    opaque = conn.opaque
                if opaque:
                    out += buffer
                    buffer.clear()
                    break
                if startup:
                    if buffer[0] == _TLS_HANDSHAKE:  # direct SSL: a TLS handshake instead of a start-up message
                        self._make_opaque(conn)
                        continue
                    if len(buffer) < 8:
                        break
                    length, code = struct.unpack_from("!ii", buffer)
                    if not 8 <= length <= _MAX_STARTUP_LENGTH:
                        self._make_opaque(conn)
                        continue
                    if len(buffer) < length:
                        break
                    if code in (_SSL_REQUEST, _GSSENC_REQUEST) and length == 8:
                        with self._lock:  # before the server can answer it
                            conn.answers_expected += 1
                    else:
                        startup = False  # the StartupMessage (or a CancelRequest, after which nothing comes)
                    out += buffer[:length]
                    del buffer[:length]
                    continue
                if len(buffer) < 5:
                    break
                kind = buffer[0]
                (length,) = struct.unpack_from("!i", buffer, 1)
                if length < 4:
                    self._make_opaque(conn)
                    continue
                if len(buffer) < 1 + length:
                    break
                message = bytes(buffer[: 1 + length])
                del buffer[: 1 + length]
                if self.rewrite is not None and kind in (_QUERY, _PARSE):
                    message = rewritten(message, self.rewrite)
                out += message
                if kind in (_QUERY, _SYNC, _FUNCTION_CALL):
                    requests += 1
                    with self._lock:  # before the server can answer it
                        conn.requests += 1
                        if kind != _FUNCTION_CALL and self._reset_armed:
                            self._reset_armed = False
                            self.counts["reset"] += 1
                            reset = True
                    if reset:
                        break
            if requests and self.observer is not None:
                self.observer.before_requests(conn.number, bytes(out), requests)
            if out and not (self._hold(conn) and self._send(conn, upstream, out, None)):
                return
            if reset:
                self._reset(conn)
                return

    def _make_opaque(self, conn: _Connection) -> None:
        with self._lock:
            conn.opaque = True

    def _reset(self, conn: _Connection) -> None:
        """Reset the client connection (SO_LINGER 0, then close: a TCP RST) and end the connection."""
        with conn.client_lock:
            conn.client_closed = True
            with contextlib.suppress(OSError):
                conn.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.client.close()
        self._end(conn)

    # -- server to client ------------------------------------------------------------------------------------

    def _server_to_client(self, conn: _Connection) -> None:
        try:
            assert conn.upstream is not None
            _Downstream(self, conn, conn.upstream).run()
        finally:
            self._thread_done(conn)

    def _take_lose(self) -> bool:
        with self._lock:
            if not self._lose_armed:
                return False
            self._lose_armed = False
            self.counts["lose-answer"] += 1
            return True

    def _delay_now(self) -> float:
        """The delay a response reaching the proxy now gets (0 outside a delay window); counted if any."""
        with self._lock:
            if self._delay_seconds <= 0 or time.monotonic() >= self._delay_until:
                return 0.0
            self.counts["delayed"] += 1
            return self._delay_seconds

    def _wait(self, conn: _Connection, seconds: float) -> bool:
        """Wait `seconds`, unless the connection ends or the proxy closes; whether it is still open."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while not (self._stopping or conn.ended.is_set()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return True
                self._changed.wait(remaining)
        return False

    def _hold(self, conn: _Connection) -> bool:
        """Wait while a blackhole lasts (counting the connection once per blackhole); whether it is still open."""
        with self._lock:
            while not (self._stopping or conn.ended.is_set()):
                remaining = self._blackhole_until - time.monotonic()
                if remaining <= 0:
                    return True
                if conn.held_generation != self._blackhole_generation:
                    conn.held_generation = self._blackhole_generation
                    self.counts["blackholed"] += 1
                self._changed.wait(remaining)
        return False

    def _send(
        self, conn: _Connection, sock: socket.socket, data: bytes | bytearray, lock: threading.Lock | None
    ) -> bool:
        """Send all of `data` (a send at a time, each with a timeout, so that the connection's end stops it)."""
        view = memoryview(bytes(data))
        while view:
            if conn.ended.is_set():
                return False
            try:
                if lock is None:
                    sent = sock.send(view)
                else:
                    with lock:
                        if conn.client_closed:
                            return False
                        sent = sock.send(view)
            except TimeoutError:
                continue
            except OSError:
                return False
            view = view[sent:]
        return True


class _Downstream:
    """The server-to-client pump of one connection: reads the server's messages, groups them into
    responses and forwards each, acting on the faults armed."""

    def __init__(self, proxy: FaultProxy, conn: _Connection, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.conn = conn
        self.upstream = upstream
        self.buffer = bytearray()  # bytes read and not yet a whole message
        self.out = bytearray()  # whole messages to forward now
        self.pending = bytearray()  # the response in progress, held until its ReadyForQuery
        self.ready = False  # the first ReadyForQuery (the end of start-up) was seen
        self.answered = 0  # ReadyForQuery messages seen after start-up: responses complete
        self.completed = False  # the response in progress holds a CommandComplete
        self.delayed = False  # the response in progress was delayed already
        self.passing = False  # the response in progress is forwarded as it arrives (COPY: the server waits)

    def run(self) -> None:
        conn = self.conn
        while not conn.ended.is_set():
            try:
                data = self.upstream.recv(_CHUNK)
            except TimeoutError:
                continue
            except OSError:
                return
            if conn.ended.is_set():
                return
            if not data:  # the server closed (a FATAL error, say): what it sent goes to the client, then the end
                self.out += self.pending + self.buffer
                self.forward()
                return
            if not self.receive(data):
                return

    def forward(self, data: bytes | bytearray | None = None) -> bool:
        """Forward `out` (then `data`), after any blackhole; whether the connection is still open."""
        if data:
            self.out += data
        if not self.out:
            return True
        proxy, conn = self.proxy, self.conn
        ok = proxy._hold(conn) and proxy._send(conn, conn.client, self.out, conn.client_lock)
        self.out.clear()
        return ok

    def forward_response(self, *, last: bool) -> bool:
        """Forward the response in progress (all of it if `last`, else what arrived of it so far)."""
        if not self.delayed:
            self.delayed = True
            seconds = self.proxy._delay_now()
            if seconds > 0 and not (self.forward() and self.proxy._wait(self.conn, seconds)):
                return False
        ok = self.forward(self.pending)
        self.pending.clear()
        if last:
            self.completed = self.delayed = self.passing = False
        return ok

    def receive(self, data: bytes) -> bool:
        """Take the bytes the server sent; whether the connection is still open."""
        proxy, conn = self.proxy, self.conn
        self.buffer += data
        while self.buffer:
            with proxy._lock:
                opaque = conn.opaque
                answer = conn.answers_expected > 0
                if answer:
                    conn.answers_expected -= 1
                    # 'S' or 'G': the server takes up encryption, and the stream cannot be read from here on.
                    conn.opaque = opaque = self.buffer[0] != b"N"[0]
            if answer:
                self.out += self.buffer[:1]
                del self.buffer[:1]
                continue
            if opaque:
                self.out += self.pending + self.buffer
                self.pending.clear()
                self.buffer.clear()
                break
            if len(self.buffer) < 5:
                break
            kind = self.buffer[0]
            (length,) = struct.unpack_from("!i", self.buffer, 1)
            if length < 4:
                with proxy._lock:
                    conn.opaque = True
                continue
            if len(self.buffer) < 1 + length:
                break
            message = bytes(self.buffer[: 1 + length])
            del self.buffer[: 1 + length]
            if not self.message(kind, message):
                return False
        if self.passing and self.pending:
            return self.forward_response(last=False) and self.forward()
        return self.forward()

    def message(self, kind: int, message: bytes) -> bool:
        """One whole message from the server; whether the connection is still open."""
        proxy, conn = self.proxy, self.conn
        if not self.ready:  # start-up and authentication: forwarded at once
            self.out += message
            self.ready = kind == _READY_FOR_QUERY
            return True
        with proxy._lock:
            outstanding = conn.requests > self.answered
        if not outstanding and not self.pending:  # asynchronous: a notification, a notice, a parameter status
            self.out += message
            return True
        self.pending += message
        if kind == _COMMAND_COMPLETE:
            self.completed = True
        elif kind in (_COPY_IN_RESPONSE, _COPY_BOTH_RESPONSE):  # the server now waits for the client
            self.passing = True
        elif kind == _READY_FOR_QUERY:
            self.answered += 1
            if proxy.observer is not None:
                proxy.observer.after_response(conn.number)
            if self.completed and len(message) == 6 and message[5] == _IDLE and proxy._take_lose():
                self.pending.clear()
                self.forward()  # what came before the response (a notification, say)
                proxy._end(conn)
                return False
            return self.forward_response(last=True)
        return True


def rewritten(message: bytes, rewrite: Callable[[str], str]) -> bytes:
    """A Query or Parse message with its statement's text made over by `rewrite` (its length set anew)."""
    kind, body = message[:1], message[5:]
    if kind == b"Q":
        head, text, tail = b"", body[: body.index(b"\0")], body[body.index(b"\0") :]
    else:  # Parse: the statement's name, then its text, then its parameters' types
        name_end = body.index(b"\0") + 1
        text_end = body.index(b"\0", name_end)
        head, text, tail = body[:name_end], body[name_end:text_end], body[text_end:]
    new = rewrite(text.decode("utf-8")).encode("utf-8")
    rest = head + new + tail
    return kind + struct.pack("!i", 4 + len(rest)) + rest


def _check_duration(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds, 0 or more: {value!r}")
