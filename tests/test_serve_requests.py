"""`tk serve` byte by byte on a socket: every request it refuses (a request line too long or
malformed, another HTTP version, a method besides GET and HEAD, headers too large, a request of
another site's page) gets its status and a one-line JSON body with the usual headers, and the
server goes on; a burst of connections is held by the kernel until it is served.

The server serves the worked examples alone (`make_server()` with nothing given: no training
needed), in a thread of this process, logging a line per request (not --quiet: the log is where
a refused request line used to fail).
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time

import pytest

from tokenkit.cli import serve, serve_api

SECURITY = serve.HEADERS  # what every answer carries, refusals too
MAX_LINE = 65536  # http.server reads a request line of at most this many bytes


class Running:
    """A server in a thread; `raw` sends bytes as they are and reads every answer until it closes."""

    def __init__(self, server: serve.Server) -> None:
        self.server, self.port = server, server.port
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def raw(self, data: bytes, timeout: float = 20) -> list[tuple[int, dict[str, str], bytes]]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            return answers(read_all(s))

    def get(self, target: str, headers: str = "") -> tuple[int, dict[str, str], bytes]:
        request = f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n{headers}\r\n"
        (answer,) = self.raw(request.encode())
        return answer


def read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(1 << 16):
        data += chunk
    return data


def answers(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The answers in `data`, one after another: (status, headers, body by Content-Length)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data[:200]
        lines = head.decode("latin-1").split("\r\n")
        assert re.fullmatch(r"HTTP/1\.1 \d{3} .*", lines[0]), lines[0]
        headers = dict(line.split(": ", 1) for line in lines[1:])
        size = int(headers["Content-Length"])
        out.append((int(lines[0].split()[1]), headers, rest[:size]))
        data = rest[size:]
    return out


def assert_refusal(answer, status: int, head: bool = False) -> str:
    """`answer` is a refusal with `status`: one line of JSON {"error": ...} (to a HEAD request its
    length only), the security headers, the connection closed after it. Its error line."""
    got, headers, body = answer
    assert got == status, (got, body)
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert {k: headers.get(k) for k in SECURITY} == SECURITY
    assert headers["Connection"] == "close" and headers["Cache-Control"] == "no-store"
    if head:
        assert body == b"" and int(headers["Content-Length"]) > 0
        return ""
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    doc = json.loads(body)
    assert list(doc) == ["error"] and doc["error"] and "Traceback" not in doc["error"]
    assert len(doc["error"]) < 300  # never the request line itself (up to 64 KiB of the user's text)
    return doc["error"]


@pytest.fixture(scope="module")
def srv():
    running = Running(serve.make_server(port=0, quiet=False))
    yield running
    running.stop()


def assert_serving(srv, capsys) -> None:
    """A good request is answered, and the log holds request lines only (no error, no traceback)."""
    status, _, body = srv.get("/api/info")
    assert status == 200 and "views" in json.loads(body)
    log = capsys.readouterr().err
    for line in log.splitlines():
        assert re.fullmatch(r"\S+ \S+ \d{3}", line), line


# ----------------------------------------------------------------------------- request lines


METHODS = ["GET", "HEAD", "POST", "get", "PRI", "G@T", "G\x00T", "\x16\x03\x01"]  # the last: a TLS hello's start
TARGETS = ["/api/info", "/", "*", "http://127.0.0.1/", "127.0.0.1:80", "/a\x7fb"]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/2", "HTTP/3.0", "HTTP/0.9", "HTTP/01.1", "HTTP/1.1.1",
            "HTTPS/1.1", "http/1.1", "HTTP/1.x", "HTTP/", "FOO/1.1", "HTTP/1.1 extra", ""]  # fmt: skip


def allowed_statuses(method: str, target: str, version: str) -> set[int]:
    """What a request line of these words may be answered with: each refusal that applies (a line
    with several defects may be refused for any of them); else 405 for a method besides GET and
    HEAD, 200 for the page and /api/info, 404 for any other path."""
    words = f"{method} {target} {version}".split()
    if len(words) != 3:
        return {400}
    method, target, version = words
    refusals = set()
    if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", method):
        refusals.add(400)
    parsed = re.fullmatch(r"HTTP/([0-9]+)\.([0-9]+)", version)
    if parsed is None:
        refusals.add(400)
    elif int(parsed[1]) != 1:
        refusals.add(505)
    if refusals:
        return refusals
    if method not in ("GET", "HEAD"):
        return {405}
    return {200} if target in ("/", "/api/info") else {404}


def test_every_kind_of_request_line_is_answered_with_its_status(srv, capsys):
    for method, target, version in itertools.product(METHODS, TARGETS, VERSIONS):
        line = f"{method} {target} {version}"
        request = f"{line}\r\nHost: {srv.host}\r\nConnection: close\r\n\r\n".encode("latin-1")
        (answer,) = srv.raw(request)
        allowed = allowed_statuses(method, target, version)
        assert answer[0] in allowed, (line, answer[0], allowed)
        if answer[0] == 200:
            assert answer[1]["Content-Security-Policy"] == serve.CSP
        else:
            assert_refusal(answer, answer[0], head=method == "HEAD" and answer[0] == 404)
            if answer[0] == 405:
                assert answer[1]["Allow"] == "GET, HEAD"
    assert_serving(srv, capsys)


@pytest.mark.parametrize(
    ("line", "status", "said"),
    [
        (b"GET /" + b"a" * MAX_LINE + b" HTTP/1.1", 414, "over 64 KiB"),
        (b"GET /api/tokens?text=" + b"x" * (MAX_LINE - 10) + b" HTTP/1.1", 414, "over 64 KiB"),
        (b"GET /" + b"a" * (MAX_LINE * 2) + b" HTTP/1.1", 414, "over 64 KiB"),  # 64 KiB unread behind it
        (b"GET / HTTP/2.0", 505, "HTTP/2.0 is not supported"),
        (b"PRI * HTTP/2.0", 505, "HTTP/2.0 is not supported"),  # HTTP/2's connection preface
        (b"GET / HTTP/1.1 x", 400, "4 words"),
        (b"GARBAGE", 400, "1 words"),
        (b"", 400, "0 words"),
        (b"   ", 400, "0 words"),
        (b"GET /", 400, "2 words"),  # HTTP/0.9: no headers would follow, no status line could answer
        (b"\xff\xfe / HTTP/1.1", 400, "method"),
        (b"POST / HTTP/1.1", 405, "method POST is not allowed"),
    ],
)  # fmt: skip
def test_a_refused_request_line_is_answered_and_the_server_goes_on(srv, capsys, line, status, said):
    (answer,) = srv.raw(line + f"\r\nHost: {srv.host}\r\n\r\n".encode())
    assert said in assert_refusal(answer, status)
    assert_serving(srv, capsys)


@pytest.mark.parametrize(
    ("headers", "said"),
    [("X-Long: " + "a" * MAX_LINE + "\r\n", "header line"), ("".join(f"X-{i}: 1\r\n" for i in range(101)), "headers")],
)
def test_headers_too_large_are_431(srv, capsys, headers, said):
    (answer,) = srv.raw(f"GET /api/info HTTP/1.1\r\nHost: {srv.host}\r\n{headers}\r\n".encode())
    assert said in assert_refusal(answer, 431)
    assert_serving(srv, capsys)


@pytest.mark.parametrize("size", [0, 5, 100_000])
def test_a_refused_method_with_a_body_is_answered_though_the_body_is_unread(srv, capsys, size):
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
        head = f"{method} /api/info HTTP/1.1\r\nHost: {srv.host}\r\nContent-Length: {size}\r\n\r\n"
        (answer,) = srv.raw(head.encode() + b"z" * size)
        assert "not allowed" in assert_refusal(answer, 405) and answer[1]["Allow"] == "GET, HEAD"
    assert_serving(srv, capsys)


def test_a_refusal_after_a_good_request_on_one_connection(srv, capsys):
    good = f"GET /api/info HTTP/1.1\r\nHost: {srv.host}\r\n\r\n"
    first, second = srv.raw((good + "GET / HTTP/2.0\r\n\r\n" + good).encode())  # the third is never read
    assert first[0] == 200 and "Connection" not in first[1]
    assert "HTTP/2.0" in assert_refusal(second, 505)
    assert_serving(srv, capsys)


def test_a_head_refusal_has_no_body(srv):
    (answer,) = srv.raw(f"HEAD /nowhere HTTP/1.1\r\nHost: {srv.host}\r\n\r\n".encode())
    assert_refusal(answer, 404, head=True)


# ----------------------------------------------------------------------------- another site's page


def origins(port: int) -> dict[str, bool]:
    """Origin header -> whether it is this server's own."""
    return {
        f"http://127.0.0.1:{port}": True,
        f"http://localhost:{port}": True,
        f"http://[::1]:{port}": True,
        "http://evil.example": False,
        f"http://evil.example:{port}": False,
        f"http://127.0.0.1:{port}.evil.example": False,
        f"https://127.0.0.1:{port}": False,
        f"http://127.0.0.1:{port + 1}": False,
        "http://127.0.0.1": False,
        "null": False,  # a file:// page, a sandboxed frame
        "": False,
    }


SITES = {None: True, "same-origin": True, "none": True, "cross-site": False, "same-site": False, "x": False}


@pytest.mark.parametrize("target", ["/api/info", "/api/example?name=chai", "/api/tokens?text=hi"])
def test_the_api_answers_its_own_page_and_scripts_never_another_sites(srv, monkeypatch, target):
    asked = []
    answer = serve_api.answer
    monkeypatch.setattr(serve_api, "answer", lambda *a: asked.append(a[1]) or answer(*a))
    for (origin, own), (site, same) in itertools.product([(None, True), *origins(srv.port).items()], SITES.items()):
        headers = "" if origin is None else f"Origin: {origin}\r\n"
        headers += "" if site is None else f"Sec-Fetch-Site: {site}\r\n"
        before = len(asked)
        status, answer_headers, body = srv.get(target, headers)
        if own and same:
            assert status in (200, 404) and len(asked) == before + 1, (origin, site, body)  # 404: no tokenizer
        else:
            error = assert_refusal((status, answer_headers, body), 403)
            assert "another site's page" in error and len(asked) == before, (origin, site)  # no work done


def test_two_origins_are_refused_and_the_page_itself_opens_from_a_link(srv):
    own = f"http://127.0.0.1:{srv.port}"
    assert_refusal(srv.get("/api/info", f"Origin: {own}\r\nOrigin: http://evil.example\r\n"), 403)
    status, _, body = srv.get("/", "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\n")
    assert status == 200 and body.startswith(b"<!doctype html>")  # a link from elsewhere opens the page


def test_cross_site_reasons():
    assert serve.cross_site(["same-origin"], ["http://localhost:80"], "127.0.0.1", 80) is None
    assert serve.cross_site([], ["http://localhost"], "127.0.0.1", 80) is None  # port 80 left out
    assert serve.cross_site([], ["http://192.168.1.5:8765"], "0.0.0.0", 8765) is None  # by address, on --host
    assert "Origin" in serve.cross_site([], ["http://rebound.example:8765"], "0.0.0.0", 8765)
    assert "Sec-Fetch-Site" in serve.cross_site(["same-site"], [], "127.0.0.1", 8765)


# ----------------------------------------------------------------------------- a burst


def test_a_burst_of_connections_waits_in_the_kernel_until_served():
    # not serving yet: every connection must be held by the listen backlog, not dropped (a dropped
    # one is tried again a second later)
    server = serve.make_server(port=0, quiet=True)
    conns = []
    try:
        for _ in range(64):
            conns.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.9))
        for s in conns:
            s.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nConnection: close\r\n\r\n".encode())
        start = time.monotonic()
        running = Running(server)
        try:
            for s in conns:
                s.settimeout(20)
                ((status, _, body),) = answers(read_all(s))
                assert status == 200 and b"views" in body
            assert time.monotonic() - start < 10
        finally:
            running.stop()
    finally:
        for s in conns:
            s.close()
        server.server_close()
