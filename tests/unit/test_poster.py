"""relay.poster against real sockets on loopback: httpx2's answers and errors, keep-alive,
and its parser of answers against whatever pieces and framings a server sends."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import ipaddress
import itertools
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import hypothesis
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import strategies as st

from outbox.relay import poster as poster_module
from outbox.relay.poster import Answered, Poster
from tests.helpers import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


def answer(body: bytes, status: str = "200 OK", close: bool = False) -> bytes:
    connection = b"close" if close else b"keep-alive"
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n".encode()
        + b"content-length: %d\r\nconnection: %b\r\n\r\n" % (len(body), connection)
        + body
    )


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/tool"


@contextlib.asynccontextmanager
async def served(handler: Handler) -> AsyncIterator[tuple[Poster, str]]:
    """A new poster and the URL of a server running ``handler``; both closed after."""
    server, url = await serve(handler)
    poster = Poster()
    try:
        yield poster, url
    finally:
        await poster.aclose()
        server.close()


async def post_once(handler: Handler, **post: Any) -> Answered:
    """One POST through a new poster to a server running ``handler``."""
    async with served(handler) as (poster, url):
        return await poster.post(url, **post)


def test_posts_json_and_reads_the_answer_with_its_headers():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = json.loads(await read_request(reader))
        writer.write(answer(json.dumps({"echo": received}).encode(), "201 Created"))
        await writer.drain()
        writer.close()

    async def main() -> Answered:
        return await post_once(handler, json={"n": "é"}, headers={"x-a": "1"}, timeout=5)

    response = asyncio.run(main())
    assert response.status_code == 201
    assert response.json() == {"echo": {"n": "é"}}
    assert response.headers["content-type"] == "application/json"


def test_a_refused_connection_is_httpx2_connect_error():
    port = free_port()  # a port nobody listens on

    async def main() -> None:
        poster = Poster()
        try:
            await poster.post(f"http://127.0.0.1:{port}/", json={}, timeout=5)
        finally:
            await poster.aclose()

    with pytest.raises(httpx2.ConnectError):
        asyncio.run(main())


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [("never answers", httpx2.ReadTimeout), ("hangs up", httpx2.RemoteProtocolError)],
)
def test_no_answer_after_the_request_is_httpx2_s_error(behaviour, error):
    """The executors tell "never sent" (ConnectError: retry) from "sent, no answer"
    (a timeout or a cut: ambiguous) by these classes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if behaviour == "never answers":
            await asyncio.sleep(30)
        writer.close()

    async def main() -> None:
        await post_once(handler, json={}, timeout=0.5)

    with pytest.raises(error):
        asyncio.run(main())


def test_a_keep_alive_connection_the_server_closed_is_not_reused():
    """Servers close idle keep-alive connections (uvicorn after 5 s): the next request
    must go on a new connection, not fail on the dead one (an ambiguous outcome)."""
    connections: list[int] = []

    async def main() -> list[int]:
        hung_up = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections))
            await read_request(reader)
            writer.write(answer(b'{"ok": true}'))  # says keep-alive, then hangs up
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            hung_up.set()

        async with served(handler) as (poster, url):
            first = await poster.post(url, json={}, timeout=5)
            await asyncio.wait_for(hung_up.wait(), timeout=5)
            second = await poster.post(url, json={}, timeout=5)
            assert first.status_code == second.status_code == 200
            return connections

    assert asyncio.run(main()) == [0, 1]


def test_a_connection_the_server_ended_is_closed_at_once():
    """A server ending an idle keep-alive connection gets the client's end at once, not
    when the pool next looks at that connection: between two waves of thousands of model
    turns the relay otherwise held thousands of half-closed sockets, each a descriptor and
    a local port (with most ports taken, opening the next wave cost the kernel about half
    a millisecond a connection)."""

    async def main() -> bytes | None:
        client_ended: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        idle = asyncio.Event()  # the client has its answer and its pool is at rest

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(answer(b'{"ok": true}'))
            await writer.drain()
            await idle.wait()
            writer.write_eof()  # the server's end, later; it still hears the client's
            try:
                client_ended.set_result(await asyncio.wait_for(reader.read(), timeout=5))
            except TimeoutError:
                client_ended.set_result(None)
            writer.close()

        async with served(handler) as (poster, url):
            assert (await poster.post(url, json={}, timeout=5)).status_code == 200
            idle.set()
            return await client_ended  # the pool is not used again meanwhile

    assert asyncio.run(main()) == b""


def test_a_burst_of_requests_opens_its_connections_a_few_at_a_time(monkeypatch):
    """Thousands of effects claimed together must not open thousands of connections in
    one burst: the server's accept queue overflows and the kernel resets connections
    that already carried a request (every one of 10,000 failed so, ``Broken pipe``)."""
    opening = {"now": 0, "most": 0}
    real_open = poster_module.open_connection

    async def counted_open(*args, **kwargs):  # the real connection, counted while it opens
        opening["now"] += 1
        opening["most"] = max(opening["most"], opening["now"])
        try:
            await asyncio.sleep(0.001)  # an opening takes a moment on a real network
            return await real_open(*args, **kwargs)
        finally:
            opening["now"] -= 1

    monkeypatch.setattr(poster_module, "open_connection", counted_open)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"ok": true}', close=True))
        await writer.drain()
        writer.close()

    async def main() -> list[int]:
        async with served(handler) as (poster, url):
            answers = await asyncio.gather(
                *(poster.post(url, json={}, timeout=30) for _ in range(300))
            )
            return [a.status_code for a in answers]

    assert asyncio.run(main()) == [200] * 300
    assert 1 < opening["most"] <= poster_module.CONNECTING


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key (cryptography, a dependency)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_is_verified_and_an_untrusted_server_is_never_sent_the_request(tmp_path):
    """Model servers are HTTPS: TLS starts on the asyncio stream, the certificate and the
    host name are checked, and a server we cannot trust is a ConnectError (never sent)."""
    cert, key = _self_signed(tmp_path)
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            received.append(await read_request(reader))
        except (asyncio.IncompleteReadError, ssl.SSLError, ConnectionError):
            return  # the client refused our certificate
        writer.write(answer(b'{"ok": true}', close=True))
        await writer.drain()
        writer.close()

    async def main() -> tuple[list[int], Exception | None]:
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]
        trusting = Poster(tls=ssl.create_default_context(cafile=str(cert)))
        untrusting = Poster()  # the system's authorities only
        refused: Exception | None = None
        try:
            statuses = [
                (await trusting.post(f"https://{host}:{port}/", json={}, timeout=5)).status_code
                for host in ("localhost", "127.0.0.1")
            ]
            try:
                await untrusting.post(f"https://localhost:{port}/", json={}, timeout=5)
            except httpx2.HTTPError as err:
                refused = err
            return statuses, refused
        finally:
            await trusting.aclose()
            await untrusting.aclose()
            server.close()

    statuses, refused = asyncio.run(main())
    assert statuses == [200, 200]
    assert isinstance(refused, httpx2.ConnectError)
    assert len(received) == 2  # the untrusted server never saw a request


def _framed(body: bytes, framing: str) -> bytes:
    """``body`` as a whole HTTP/1.1 answer in ``framing``."""
    if framing == "content-length":
        return answer(body)
    if framing == "chunked":
        chunks = b"".join(
            b"%x;ext=1\r\n%b\r\n" % (len(body[i : i + 7]), body[i : i + 7])
            for i in range(0, len(body), 7)
        )
        return (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks
            + b"0\r\nx-trailer: 1\r\n\r\n"
        )
    if framing == "until the end":  # no length: the body ends with the connection
        return b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n" + body
    if framing == "after 100 Continue":
        return b"HTTP/1.1 100 Continue\r\n\r\n" + answer(body)
    raise AssertionError(framing)


@pytest.mark.parametrize(
    "framing", ["content-length", "chunked", "until the end", "after 100 Continue"]
)
@pytest.mark.parametrize("piecewise", [False, True], ids=["at once", "byte by byte"])
def test_an_answer_in_any_framing_is_read_whole(framing, piecewise):
    body = json.dumps({"text": "é" * 40, "n": list(range(20))}).encode()
    wire = _framed(body, framing)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for piece in [wire[i : i + 1] for i in range(len(wire))] if piecewise else [wire]:
            writer.write(piece)
            await writer.drain()
        if framing == "until the end":
            writer.close()
        await reader.read()  # keep-alive: until the client goes
        writer.close()

    async def main() -> Answered:
        return await post_once(handler, json={}, timeout=5)

    response = asyncio.run(main())
    assert response.status_code == 200
    assert response.content == body


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    body=st.binary(max_size=300),
    chunk_sizes=st.lists(st.integers(1, 50), min_size=1, max_size=10),
    cuts=st.lists(st.integers(0, 400), max_size=12),
    chunked=st.booleans(),
)
def test_an_answer_cut_anywhere_parses_to_its_body(body, chunk_sizes, cuts, chunked):
    """The parser sees an answer in whatever pieces the network delivers it."""
    if chunked:
        pieces, i, n = [], 0, 0
        while i < len(body):
            size = chunk_sizes[n % len(chunk_sizes)]
            pieces.append(b"%X\r\n%b\r\n" % (len(body[i : i + size]), body[i : i + size]))
            i, n = i + size, n + 1
        wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"".join(pieces)
        wire += b"0\r\n\r\n"
    else:
        wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    bounds = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    parsed = poster_module.Answer()
    done = [parsed.feed(wire[a:b]) for a, b in itertools.pairwise(bounds)]
    assert done[-1] and not any(done[:-1])
    assert bytes(parsed.body) == body
    assert parsed.reusable


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/2 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length : 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 000 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n" * 9 + b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1" * 70_000,
    ],
    ids=[
        "not HTTP/1",
        "four-digit status",
        "header without colon",
        "space before colon",
        "two lengths",
        "prefixed chunk size",
        "chunk without CRLF",
        "not chunked",
        "chunked after another coding",
        "status 000",
        "a 5,000-digit length",
        "endless 1xx",
        "endless chunk line",
    ],
)
def test_an_answer_that_is_not_http_1_1_is_a_remote_protocol_error(wire):
    """Sent and answered with something unreadable: ambiguous for the executors, and the
    connection is not reused."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(wire)
        await writer.drain()
        await reader.read()
        writer.close()

    async def main() -> None:
        await post_once(handler, json={}, timeout=5)

    with pytest.raises(httpx2.RemoteProtocolError):
        asyncio.run(main())


@pytest.mark.parametrize(
    "headers",
    [{"x-a": "1\r\nx-injected: 2"}, {"x-a\r\nx-injected": "2"}, {"x a": "1"}, {"": "1"}],
    ids=["line break in a value", "line break in a name", "space in a name", "empty name"],
)
def test_a_header_that_is_not_valid_is_refused_before_anything_is_sent(headers):
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read())
        writer.close()

    async def main() -> None:
        await post_once(handler, json={}, headers=headers, timeout=5)

    with pytest.raises(httpx2.LocalProtocolError):
        asyncio.run(main())
    assert received in ([], [b""])


def test_keep_alive_connections_are_reused_until_the_server_says_close():
    """Requests one after another share a connection; an answer saying ``connection:
    close`` ends it, and the next request opens another."""
    requests_per_connection: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests_per_connection.append(0)
        for n in range(1, 4):
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            requests_per_connection[-1] += 1
            writer.write(answer(b'{"ok": true}', close=n == 3))
            await writer.drain()
        writer.close()

    async def main() -> list[int]:
        async with served(handler) as (poster, url):
            for _ in range(5):
                assert (await poster.post(url, json={}, timeout=5)).status_code == 200
            return requests_per_connection

    assert asyncio.run(main()) == [3, 2]


def test_a_connection_idle_for_idle_s_is_not_reused():
    """A kept-alive connection unused for ``IDLE_S`` is not sent the next request: its
    server may be ending it right then, and a request it ends unread is an ambiguous
    outcome."""
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(answer(b'{"ok": true}'))
            await writer.drain()
        writer.close()

    async def main() -> tuple[int, int]:
        async with served(handler) as (poster, url):
            await poster.post(url, json={}, timeout=5)
            await poster.post(url, json={}, timeout=5)  # at once: the same connection
            reused = connections
            [kept] = [c for idle in poster.idle.values() for c in idle]
            kept.idle_since -= poster_module.IDLE_S  # as if unused since then
            await poster.post(url, json={}, timeout=5)
            return reused, connections

    assert asyncio.run(main()) == (1, 2)


def test_a_repeatable_request_takes_a_connection_idle_up_to_repeatable_idle_s():
    """A model turn (``repeatable``: sent again when lost) takes a connection idle past
    ``IDLE_S``, which another request leaves to it; past ``REPEATABLE_IDLE_S`` no request
    takes it, and it is closed."""
    connections: list[int] = []  # requests served, per connection

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(0)
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            connections[-1] += 1
            writer.write(answer(b'{"ok": true}'))
            await writer.drain()
        writer.close()

    def age(poster: Poster, seconds: float) -> None:
        for idle in poster.idle.values():
            for connection in idle:
                connection.idle_since -= seconds  # as if unused for that much longer

    async def main() -> tuple[list[int], list[int], list[int], int]:
        async with served(handler) as (poster, url):
            await poster.post(url, json={}, timeout=5, repeatable=True)
            age(poster, poster_module.IDLE_S + 0.1)
            await poster.post(url, json={}, timeout=5)  # not the idle one: a new connection
            first = list(connections)
            age(poster, poster_module.IDLE_S + 0.1)  # both idle past IDLE_S, under 4 s
            await poster.post(url, json={}, timeout=5, repeatable=True)  # the one used last
            await poster.post(url, json={}, timeout=5, repeatable=True)  # the same, again
            second = list(connections)
            age(poster, poster_module.REPEATABLE_IDLE_S)
            await poster.post(url, json={}, timeout=5, repeatable=True)
            kept = [c for idle in poster.idle.values() for c in idle]
            return first, second, list(connections), len(kept)

    first, second, third, kept = asyncio.run(main())
    assert first == [1, 1]
    assert second == [1, 3]
    assert third == [1, 3, 1] and kept == 1  # the two old ones closed, the new one kept


@pytest.mark.parametrize(
    ("head", "body", "content", "text"),
    [
        # a server may encode what it sends (no accept-encoding: any coding is acceptable)
        (
            b"content-encoding: gzip\r\n",
            gzip.compress(b'{"ok": 1}', mtime=0),
            b'{"ok": 1}',
            '{"ok": 1}',
        ),
        (b"content-type: text/plain; charset=latin-1\r\n", b"caf\xe9", b"caf\xe9", "café"),
        (b"content-type: text/plain\r\n", b"caf\xc3\xa9 \xff", b"caf\xc3\xa9 \xff", "café \ufffd"),
        (b"content-type: text/plain; charset=nonesuch\r\n", b"ok", b"ok", "ok"),
    ],
    ids=["gzip", "latin-1", "utf-8 and a stray byte", "an unknown charset"],
)
def test_an_answer_s_content_and_text_are_as_httpx2_s(head, body, content, text):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n" + head + b"content-length: %d\r\n\r\n" % len(body))
        writer.write(body)
        await writer.drain()
        writer.close()

    response = asyncio.run(post_once(handler, json={}, timeout=5))
    assert (response.content, response.text) == (content, text)
    reference = httpx2.Response(200, headers=response.headers, content=body)
    if b"nonesuch" not in head:  # (httpx2 refuses a charset Python does not know)
        assert (reference.content, reference.text) == (content, text)


def test_the_read_timeout_counts_from_the_latest_bytes():
    """``timeout`` bounds each wait for bytes, as ``httpx2``'s read timeout: an answer
    trickling in for longer than the timeout, but never silent for that long, is read."""
    body = b'{"ok": true}'
    wire = answer(body)
    pieces = [wire[: len(wire) // 3], wire[len(wire) // 3 : -3], wire[-3:]]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for piece in pieces:
            await asyncio.sleep(0.8)
            writer.write(piece)
            await writer.drain()
        await reader.read()
        writer.close()

    async def main() -> Answered:
        async with served(handler) as (poster, url):
            return await poster.post(url, json={}, timeout=2)  # 2.4 s in all

    assert asyncio.run(main()).content == body


@pytest.mark.parametrize(
    ("url", "line"),
    [
        ("http://127.0.0.1:{port}/a b/é?q=1 2", b"POST /a%20b/%C3%A9?q=1%202 HTTP/1.1"),
        ("http://user:pw@127.0.0.1:{port}", b"POST / HTTP/1.1"),
    ],
)
def test_the_request_line_is_a_valid_one_for_any_url(url, line):
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        await reader.readexactly(2)
        writer.write(answer(b"{}", close=True))
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        poster = Poster()
        try:
            await poster.post(url.format(port=port), json={}, timeout=5)
        finally:
            await poster.aclose()
            server.close()

    asyncio.run(main())
    first, host = heads[0].split(b"\r\n")[:2]
    assert first == line
    assert host.lower().startswith(b"host: 127.0.0.1:")


def test_concurrent_requests_get_a_connection_each_and_later_ones_reuse_them():
    """A connection carries one request at a time; kept-alive ones serve the next wave."""
    opened: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(1)
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            await asyncio.sleep(0.01)  # still answering when the others arrive
            writer.write(answer(b"{}"))
            await writer.drain()
        writer.close()

    async def main() -> None:
        async with served(handler) as (poster, url):
            for _ in range(3):
                await asyncio.gather(*(poster.post(url, json={}, timeout=5) for _ in range(10)))

    asyncio.run(main())
    assert 1 < len(opened) <= 10


def test_idle_connections_are_closed_after_a_while_and_busy_ones_never():
    """``close_idle`` (the engine calls it every second) closes what no request may take
    (idle for ``REPEATABLE_IDLE_S``), so a burst's sockets do not stay open for good; a
    connection carrying a request is not idle, however old."""

    async def main() -> tuple[int, int, int, int]:
        ended: list[bytes] = []
        release = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    body = await read_request(reader)
                except asyncio.IncompleteReadError:
                    ended.append(b"")  # the client closed this connection
                    break
                if body == b'{"hold":true}':
                    await release.wait()
                writer.write(answer(b"{}"))
                await writer.drain()
            writer.close()

        async with served(handler) as (poster, url):
            await asyncio.gather(*(poster.post(url, json={}, timeout=5) for _ in range(3)))
            idle_now = poster.close_idle(time.monotonic())
            held = asyncio.create_task(poster.post(url, json={"hold": True}, timeout=5))
            while not poster.busy:  # the held request is on its connection
                await asyncio.sleep(0.001)
            later = time.monotonic() + poster_module.REPEATABLE_IDLE_S + 1
            idle_later = poster.close_idle(later)
            release.set()
            status = (await held).status_code
            while len(ended) < idle_later:  # the server sees the closed ones end
                await asyncio.sleep(0.001)
            return idle_now, idle_later, status, poster.close_idle(time.monotonic())

    idle_now, idle_later, status, after = asyncio.run(main())
    assert (idle_now, status) == (0, 200)
    assert idle_later == 2  # three were kept; the held request took one of them
    assert after == 0  # the one that carried it was used just now


def test_the_poster_sets_host_length_and_one_content_type():
    """A caller's (or a credential's) Host or Content-Length would make a second one, which
    servers refuse; the poster's own stand. A caller's Content-Type, any case, is kept."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head.lower())
        await reader.readexactly(2)
        writer.write(answer(b"{}", close=True))
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with served(handler) as (poster, url):
            headers = {"Host": "elsewhere", "Content-Length": "99", "Content-Type": "x/y"}
            await poster.post(url, json={}, headers=headers, timeout=5)

    asyncio.run(main())
    [head] = heads
    assert head.count(b"host:") == head.count(b"content-length:") == 1
    assert b"content-length: 2\r\n" in head and b"elsewhere" not in head
    assert head.count(b"content-type:") == 1 and b"content-type: x/y" in head


def test_a_connection_is_not_kept_while_part_of_its_request_is_unsent():
    """A server may answer before it has read the whole body; what is still unsent would
    precede the next request on that connection, so the next one gets a new connection."""
    opened: list[int] = []
    big = {"pad": "x" * 8_000_000}  # more than the socket buffers hold

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(1)
        await reader.readuntil(b"\r\n\r\n")  # the head only: the answer comes first
        writer.write(answer(b"{}"))
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()

    async def main() -> None:
        async with served(handler) as (poster, url):
            await poster.post(url, json=big, timeout=5)
            kept = sum(len(idle) for idle in poster.idle.values())
            assert kept == 0

    asyncio.run(main())


def test_an_idle_connection_does_not_keep_its_last_answer():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"big": "' + b"x" * 100_000 + b'"}'))
        await writer.drain()
        await reader.read()
        writer.close()

    async def main() -> list[object]:
        async with served(handler) as (poster, url):
            await poster.post(url, json={}, timeout=5)
            [connection] = [c for idle in poster.idle.values() for c in idle]
            return [connection.answer, connection.waiter]

    assert asyncio.run(main()) == [None, None]


ENDLESS_HEADS = {
    "content-length": b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n",
    "chunked, small chunks": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
    "chunked, one huge chunk": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"40000000\r\n",
    "until the end": b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
}


@pytest.mark.parametrize("framing", ENDLESS_HEADS)
def test_a_body_past_max_body_is_cut_and_its_connection_dropped(framing):
    """A server that would send a gigabyte: the answer comes back cut at ``max_body`` (what
    the relay holds of it stays near that), marked, and its connection is not kept."""
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(ENDLESS_HEADS[framing])
        piece = b"x" * 4096
        if framing == "chunked, small chunks":
            piece = b"1000\r\n" + piece + b"\r\n"
        with contextlib.suppress(ConnectionError):
            for _ in range(250_000):  # a gigabyte, unless the client stops reading
                writer.write(piece)
                await writer.drain()
        writer.close()

    async def main() -> tuple[Answered, Answered]:
        async with served(handler) as (poster, url):
            first = await poster.post(url, json={}, timeout=5, max_body=100_000)
            return first, await poster.post(url, json={}, timeout=5, max_body=100_000)

    for response in asyncio.run(main()):
        assert response.status_code == 200
        assert response.extensions["body_cut_at"] == 100_000
        assert len(response.content) <= 100_000
        assert set(response.content) <= {ord("x")}
    assert connections == 2


def test_a_body_within_max_body_is_read_whole_and_its_connection_kept():
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for _ in range(2):
            await read_request(reader)
            writer.write(answer(b'"' + b"y" * 99_998 + b'"'))
            await writer.drain()
        writer.close()

    async def main() -> list[httpx2.Response]:
        async with served(handler) as (poster, url):
            return [await poster.post(url, json={}, timeout=5, max_body=100_000) for _ in "ab"]

    for response in asyncio.run(main()):
        assert "body_cut_at" not in response.extensions
        assert len(response.json()) == 99_998
    assert connections == 1


def sse_head() -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def has_done(found: poster_module.Answer) -> bool:
    return b"done" in found.body


def test_a_body_that_is_enough_on_a_stream_left_open_ends_there_and_its_connection_goes():
    """The server sends what the caller needs and keeps the body open: the answer comes
    back with what arrived (``ended_early``) long before the read timeout, and the
    connection is closed (the server sees it go), never reused."""
    closed = asyncio.Event()
    connections = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        await read_request(reader)
        writer.write(sse_head() + chunk(b"data: first\n\n") + chunk(b"data: done\n\n"))
        await writer.drain()
        if await reader.read(1) == b"":
            closed.set()
        writer.close()

    async def main() -> list[httpx2.Response]:
        async with served(handler) as (poster, url):
            answers = [
                await poster.post(url, json={}, timeout=30, enough=has_done) for _ in range(2)
            ]
            async with asyncio.timeout(10):
                await closed.wait()
            return answers

    for found in asyncio.run(main()):
        assert found.content == b"data: first\n\ndata: done\n\n"
        assert found.extensions == {"ended_early": True}
    assert connections[0] == 2


def test_a_body_that_is_enough_and_then_ends_keeps_its_connection():
    """A server that ends the body right after what the caller needs (as an MCP server
    should after its answer): the answer is whole and the connection is kept for the next
    request."""
    requests = [0]
    connections = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            requests[0] += 1
            writer.write(sse_head() + chunk(b"data: done\n\n"))
            await writer.drain()
            writer.write(b"0\r\n\r\n")  # the end, in a write of its own
            await writer.drain()
        writer.close()

    async def main() -> list[httpx2.Response]:
        async with served(handler) as (poster, url):
            return [await poster.post(url, json={}, timeout=5, enough=has_done) for _ in range(3)]

    for found in asyncio.run(main()):
        assert found.content == b"data: done\n\n" and "ended_early" not in found.extensions
    assert (requests[0], connections[0]) == (3, 1)


@pytest.mark.parametrize(("timeout", "total"), [(0.3, None), (5.0, 0.3)])
def test_an_answer_in_the_socket_when_the_deadline_passes_is_read_not_a_timeout(timeout, total):
    """A process paused past a request's deadline (SIGSTOP, a frozen VM) wakes with its
    timer due and the answer whole in its socket: the answer came in time, and is taken.
    Here the loop itself is held: the server answers at once, then blocks the loop past
    the deadline before the poster has read a byte."""
    body = b'{"ok": true}'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(body))  # sent at once: the answer is in the poster's socket
        time.sleep(0.8)  # the loop held past the deadline, on purpose
        await reader.read()
        writer.close()

    async def main() -> Answered:
        async with served(handler) as (poster, url):
            bounds = {"timeout": timeout} if total is None else {"timeout": timeout, "total": total}
            return await poster.post(url, json={}, **bounds)

    assert asyncio.run(main()).content == body


def test_a_whole_answer_not_in_by_total_is_a_read_timeout():
    """``total`` bounds the whole answer, however steadily its bytes trickle in."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_head())
        for _ in range(40):
            writer.write(chunk(b": still here\n\n"))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.close()

    async def main() -> None:
        await post_once(handler, json={}, timeout=1.0, total=0.5)

    with pytest.raises(httpx2.ReadTimeout, match="whole answer"):
        asyncio.run(main())


def test_an_answer_that_reaches_the_socket_as_the_deadline_fires_is_read_not_a_timeout():
    """The loop, held past the deadline, runs the deadline's timer in the same turn as the
    server's write of the answer: the answer is in the socket, not yet read, when the timer
    fires (either order). The timer gives the loop one more I/O pass before a timeout."""
    body = b'{"ok": true}'
    writers: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await writers.put(writer)
        await reader.read()
        writer.close()

    async def main() -> Answered:
        async with served(handler) as (poster, url):
            sent = asyncio.ensure_future(poster.post(url, json={}, timeout=0.3))
            writer = await writers.get()
            loop = asyncio.get_running_loop()
            loop.call_soon(time.sleep, 0.6)  # the loop held past the deadline, on purpose
            loop.call_later(0.2, writer.write, answer(body))  # due in the same turn as it
            return await sent

    assert asyncio.run(main()).content == body
