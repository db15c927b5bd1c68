"""`tk serve`: a small web server on this machine for the page that shows a tokenizer and a model
at work (cli/page/), and the JSON endpoints the page reads (cli/serve_api.py, docs/serve.md).

It runs beside the user's browser, so it trusts nothing a request says:
- it listens on 127.0.0.1 unless --host says otherwise (then it warns: the page has no login);
- it answers only requests whose Host header names the address it serves: a page of another site
  whose name was made to resolve to 127.0.0.1 ("DNS rebinding") gets 403;
- a request line is checked before http.server reads it: over 64 KiB is 414, one that is not
  `METHOD /PATH HTTP/1.x` 400, another HTTP version 505, a method besides GET and HEAD 405;
- the API answers the page itself and clients that send no Origin (curl, scripts), never another
  site's page: a request with `Sec-Fetch-Site` other than same-origin or none, or an Origin not
  of this server, is 403 (`cross_site`), so that a page the user visits cannot make it compute;
- no request reaches the file system: the page's files are read once at the start into a table
  keyed by their exact names (`page_files`: cli/page's regular files), and any other path is 404;
- every query is bounded before any work (cli/serve_api.py); a bad one is 400, an unexpected
  failure 500; every refusal is a one-line JSON `{"error": ...}` with the headers below, the
  connection is closed after it, and the server goes on;
- every answer forbids sources other than itself (Content-Security-Policy), sniffing and framing.

Model and tokenizer work runs under one lock (NumPy uses the cores already), the training log's
reading under another, so that a long log never stalls the other views; the model file is
loaded again when training replaces it (`pipeline.live.LiveModel`). Ctrl-C or SIGTERM stop it
through cli/main.py's handlers, with one line and exit code 130 or 143, as every command.

What it deliberately does not do: compute what a view shows (pipeline/views.py), or draw it (the
page does).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import socket
import stat
import sys
import threading
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import TCPServer
from typing import TYPE_CHECKING

import click

from tokenkit.bpe.errors import DisallowedSpecialError, TokenizerError
from tokenkit.cli.options import check_device, device_option
from tokenkit.cli.params import count
from tokenkit.common import readfile
from tokenkit.common.errors import FileError
from tokenkit.common.messages import one_line
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer.errors import ModelError

if TYPE_CHECKING:
    from tokenkit.cli import serve_api  # the endpoints (NumPy, the model): imported when serving, not for --help

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
PAGE_DIR = Path(__file__).parent / "page"
PAGE_FILE_LIMIT = 4 * readfile.MIB  # the page is a few files of tens of KB
REQUEST_TIMEOUT_S = 60  # a connection that sends nothing for this long is closed
LISTEN_BACKLOG = 128  # connections the kernel holds until accepted: a burst beyond it waits a second (SYN resent)
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
}
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # no dot files, no spaces, no escapes
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,40}")  # an HTTP token (RFC 9110's tchar), bounded
_VERSION = re.compile(r"HTTP/([0-9]{1,3})\.([0-9]{1,3})")
_SHAPE = "a request line is METHOD /PATH HTTP/1.1"
_REFUSED = {  # http.server's own refusals, said as ours
    HTTPStatus.REQUEST_URI_TOO_LONG: "the request line is over 64 KiB; send a shorter text",
    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: "a header line over 64 KiB, or over 100 headers",
}
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; object-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
USER_ERRORS = (TokenizerError, ModelError, PipelineError, FileError)


class ServeError(click.ClickException):
    """The server cannot start (a port in use, an address not of this machine): one line, exit 1."""


def page_files(root: Path = PAGE_DIR) -> dict[str, tuple[bytes, str]]:
    """The page's files, read once: "/" + the path under `root` -> (contents, Content-Type); "/"
    is index.html. Regular files only (no links), names of letters, digits, ".", "_" and "-" (no
    dot files), of the types in CONTENT_TYPES; subfolders likewise."""
    files: dict[str, tuple[bytes, str]] = {}
    for folder, subfolders, names in os.walk(root):  # links to folders are not followed
        subfolders[:] = sorted(d for d in subfolders if _SAFE_NAME.fullmatch(d))
        for name in sorted(names):
            path = Path(folder) / name
            kind = CONTENT_TYPES.get(path.suffix.lower())
            if kind is None or not _SAFE_NAME.fullmatch(name) or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            files["/" + path.relative_to(root).as_posix()] = (
                readfile.read_bytes(path, PAGE_FILE_LIMIT, "a page file"),
                kind,
            )
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine alone (localhost, 127.x.x.x, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def host_allowed(header: str, host: str, port: int) -> bool:
    """Whether a request's Host header names this server: the address it listens on (or
    localhost, 127.0.0.1, [::1]) with its port. On a non-loopback address (--host 0.0.0.0) any IP
    address with its port too, so that other machines can reach it by address, never by a name
    someone else's DNS controls.

    >>> host_allowed("127.0.0.1:8765", "127.0.0.1", 8765), host_allowed("evil.example:8765", "127.0.0.1", 8765)
    (True, False)
    """
    names = {_url_host(host), "localhost", "127.0.0.1", "[::1]"}
    if header in {f"{name}:{port}" for name in names} or (port == 80 and header in names):
        return True
    if is_loopback(host):
        return False
    name, _, given_port = header.rpartition(":")
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return given_port == str(port)


def request_line_refusal(line: str) -> tuple[int, str] | None:
    """(status, one line) refusing a request line (without its CRLF), or None where http.server
    may read it: three words, a method that is a token, HTTP/1.x. Never echoes the line (it may be
    64 KiB of the user's text). The method is judged later (405), the target by its lookup (404).

    >>> request_line_refusal("GET /api/info HTTP/1.1"), int(request_line_refusal("GET / HTTP/2.0")[0])
    (None, 505)
    """
    words = line.split()
    if len(words) != 3:
        return HTTPStatus.BAD_REQUEST, f"a malformed request line ({len(words)} words); {_SHAPE}"
    method, _, version = words
    if not _METHOD.fullmatch(method):
        return HTTPStatus.BAD_REQUEST, f"a malformed method (not an HTTP token); {_SHAPE}"
    found = _VERSION.fullmatch(version)
    if found is None:
        return HTTPStatus.BAD_REQUEST, f"a malformed HTTP version; {_SHAPE}"
    if found[1].lstrip("0") != "1":
        shown = f"HTTP/{int(found[1])}.{int(found[2])}"
        return HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"{shown} is not supported; tk serve speaks HTTP/1.0 and 1.1"
    return None


def origin_allowed(origin: str, host: str, port: int) -> bool:
    """Whether a request's Origin header is this server's own: http:// and a name `host_allowed`
    accepts (so "null", another scheme, port or name is not).

    >>> origin_allowed("http://localhost:8765", "127.0.0.1", 8765), origin_allowed("null", "127.0.0.1", 8765)
    (True, False)
    """
    return origin.startswith("http://") and host_allowed(origin.removeprefix("http://"), host, port)


def cross_site(sites: list[str], origins: list[str], host: str, port: int) -> str | None:
    """Why a request to the API comes from another site's page (the Sec-Fetch-Site and Origin
    headers it carries, each list empty when absent), or None. A browser says `same-origin` for
    the page's own requests and `none` for an address typed in; anything else (cross-site,
    same-site: another origin) is refused, as is an Origin that is not this server's.

    >>> cross_site([], [], "127.0.0.1", 8765), cross_site(["cross-site"], [], "127.0.0.1", 8765)
    (None, "Sec-Fetch-Site is 'cross-site'")
    """
    for site in sites:
        if site.strip().lower() not in ("same-origin", "none"):
            return f"Sec-Fetch-Site is {one_line(site)[:40]!r}"
    if len(origins) > 1:
        return "it carries more than one Origin header"
    if origins and not origin_allowed(origins[0].strip(), host, port):
        return f"its Origin is {one_line(origins[0])[:100]!r}"
    return None


class Handler(BaseHTTPRequestHandler):
    """One connection: GET and HEAD of the page's files and the JSON endpoints; anything else is
    answered with one line of JSON."""

    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "tk-serve"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_S
    default_request_version = "HTTP/1.1"  # a refusal is answered with its status line, never as HTTP/0.9
    path = ""  # until a request line is read: what the log line and the refusals read

    def parse_request(self) -> bool:
        """The request line checked (`request_line_refusal`) before http.server reads it and the
        headers; a refusal is answered here and the request goes no further (False)."""
        refusal = request_line_refusal(self.raw_requestline.decode("latin-1").rstrip("\r\n"))
        if refusal is None:
            return super().parse_request()
        self.command, self.request_version, self.requestline = None, self.default_request_version, ""
        self.send_error(*refusal)
        return False

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:
        self._respond()

    def do_HEAD(self) -> None:
        self._respond()

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # POST, PUT, DELETE, OPTIONS, any method http.server would call 501
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self._send_json(
            HTTPStatus.METHOD_NOT_ALLOWED,
            {"error": f"method {self.command[:20]} is not allowed; tk serve answers GET and HEAD"},
            {"Allow": "GET, HEAD"},
        )

    def _respond(self) -> None:
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not host_allowed(hosts[0], self.server.host, self.server.port):
            self._send_json(
                HTTPStatus.FORBIDDEN,
                {"error": f"this server answers requests for {self.server.url} only (the Host header names another)"},
            )
            return
        path, _, query = self.path.partition("?")
        why = path.startswith("/api/") and self._cross_site()
        if why:
            self._send_json(HTTPStatus.FORBIDDEN, {"error": why})
            return
        page = self.server.files.get(path)
        if page is not None:
            self._send(HTTPStatus.OK, page[0], page[1], "no-cache")
        elif path.startswith("/api/"):
            status, body = self.server.api(path, query)
            self._send(status, body, "application/json; charset=utf-8", "no-store")
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "not found"})

    def _cross_site(self) -> str | None:
        """The one line refusing a request from another site's page (`cross_site`), or None."""
        sites, origins = self.headers.get_all("Sec-Fetch-Site") or [], self.headers.get_all("Origin") or []
        why = cross_site(sites, origins, self.server.host, self.server.port)
        if why is None:
            return None
        return (
            f"this request comes from another site's page ({why}); tk serve's API answers its own page, "
            f"{self.server.url}, and clients that send no Origin (curl, scripts)"
        )

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The refusals of the request line and http.server's own (a line too long, malformed
        headers), as JSON."""
        self._send_json(code, {"error": _REFUSED.get(code) or message or HTTPStatus(code).phrase})

    def _send_json(self, status: int, doc: dict, headers: dict[str, str] | None = None) -> None:
        self._send(status, _json(doc), "application/json; charset=utf-8", "no-store", headers)

    def _send(self, status: int, body: bytes, kind: str, cache: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {
            "Content-Type": kind,
            "Content-Length": str(len(body)),
            "Cache-Control": cache,
            **HEADERS,
            **(headers or {}),
        }.items():
            self.send_header(name, value)
        if status >= 400:  # a refused request may have sent a body we did not read: not one more on this connection
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code="-", size="-") -> None:
        if not self.server.quiet:  # the path only: a query holds the user's text
            path = (self.path or "-").partition("?")[0][:200]  # "-": a request line refused unread
            self.server.note(f"{self.command or '-'} {path} {int(code) if str(code).isdigit() else code}")

    def log_message(self, format: str, *args) -> None:
        if not self.server.quiet:
            self.server.note((format % args).replace("\n", " ")[:300])


def _json(doc) -> bytes:
    return (json.dumps(doc, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


class Server(ThreadingHTTPServer):
    """The HTTP server over `held` (serve_api.Holdings): `serve_forever()` in any thread,
    `shutdown()` from another, `server_close()` at the end (or use it in a `with`)."""

    daemon_threads = True  # a request in progress does not keep the process alive once it stops
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, held: serve_api.Holdings, host: str, port: int, *, quiet: bool = True, files=None) -> None:
        self.held = held
        self.quiet = quiet
        self.files = page_files() if files is None else files
        self.lock = threading.Lock()
        self.log_lock = threading.Lock()  # the training log's own: a long log's first read stalls no other view
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.host = host
        super().__init__((host, port), Handler)
        self.port = self.server_address[1]

    def server_bind(self) -> None:
        # HTTPServer's would look this machine's name up in DNS (socket.getfqdn): slow, and not needed
        TCPServer.server_bind(self)
        self.server_name, self.server_port = self.host, self.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}/"

    def api(self, path: str, query: str) -> tuple[int, bytes]:
        """(status, JSON body) of an endpoint; never raises."""
        from tokenkit.cli import serve_api

        try:
            with self.log_lock if path == "/api/training" else self.lock:
                doc = serve_api.answer(self.held, path, query)
            return HTTPStatus.OK, _json(doc)  # outside the lock: a big answer takes a moment to write
        except serve_api.Refused as err:
            return err.status, _json({"error": one_line(err)})
        except DisallowedSpecialError as err:
            return HTTPStatus.BAD_REQUEST, _json({"error": one_line(err.advise("specials=allow", "specials=text"))})
        except USER_ERRORS as err:
            return HTTPStatus.BAD_REQUEST, _json({"error": one_line(err)})
        except MemoryError:
            return HTTPStatus.INTERNAL_SERVER_ERROR, _json({"error": "out of memory; use a shorter text"})
        except Exception as err:  # a bug: said in one line, here and to the page; the server goes on
            line = f"internal error in {path}: {type(err).__name__}: {one_line(err)}"[:500]
            self.note(f"error: {line}")
            return HTTPStatus.INTERNAL_SERVER_ERROR, _json({"error": line})

    def handle_error(self, request, client_address) -> None:
        """A connection that failed outside the endpoints (the browser went away mid-answer): one
        line unless quiet, never socketserver's traceback."""
        err = sys.exc_info()[1]
        if not self.quiet and not isinstance(err, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            self.note(f"connection from {client_address[0]}: {type(err).__name__}: {one_line(err)}"[:300])

    def note(self, line: str) -> None:
        try:
            sys.stderr.write(f"{line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def make_server(
    source: str | os.PathLike | None = None,
    *,
    tokenizer: str | os.PathLike | None = None,
    compare: str | os.PathLike | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    device: str = "cpu",
    quiet: bool = True,
) -> Server:
    """A server for `source` (a run directory or a model file, or None), `tokenizer` (-t) and
    `compare` (-c), listening on host:port (port 0: any free one; `server.port` says which). Run
    it with `serve_forever()` (in a thread, say), stop it with `shutdown()` and `server_close()`.
    Files that do not load, a port in use, an address not of this machine: one-line errors."""
    from tokenkit.cli import serve_api

    held = serve_api.open_holdings(
        None if source is None else Path(source),
        None if tokenizer is None else Path(tokenizer),
        None if compare is None else Path(compare),
        device,
    )
    try:
        return Server(held, host, port, quiet=quiet)
    except OSError as err:
        raise ServeError(_bind_error(err, host, port)) from None


def _bind_error(err: OSError, host: str, port: int) -> str:
    if err.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use (another tk serve?); pick another with --port (0: any free one)"
    if err.errno == errno.EACCES:
        return f"cannot listen on port {port} ({err.strerror}); pick a port above 1023 with --port"
    why = err.strerror or one_line(err)
    return f"cannot listen on {host} ({why}); give an address of this machine with --host (default {DEFAULT_HOST})"


def open_browser(url: str) -> bool:
    """Open `url` in the user's browser, in the background; False where there is no display."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False
    threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    return True


@click.command("serve")
@click.argument("source", required=False, metavar="[RUN_OR_MODEL]", type=click.Path(path_type=Path))
@click.option(
    "-t", "--tokenizer", "tokenizer_path", type=click.Path(path_type=Path),
    help="tokenizer.safetensors (or a model or run holding one): for a model file without one, or alone",
)  # fmt: skip
@click.option(
    "-c", "--compare", "compare_path", type=click.Path(path_type=Path),
    help="a second tokenizer (file, model or run), shown beside the first",
)  # fmt: skip
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="address to listen on (another: a warning)")
@click.option(
    "--port", default=DEFAULT_PORT, show_default=True, type=count(0, 65535), help="port to listen on; 0 = any free one"
)
@click.option("--no-browser", is_flag=True, help="do not open the page in a browser")
@click.option("-q", "--quiet", is_flag=True, help="no line per request on stderr")
@device_option
def serve_command(source, tokenizer_path, compare_path, host, port, no_browser, quiet, device) -> int:
    """Serve a page that shows your tokenizer and model at work: tokens, BPE merges one by one,
    attention with its arithmetic, next-token odds, training curves (live), the model's blocks.

    RUN_OR_MODEL is a run directory (every view; its training is followed while it runs) or a
    model file; without it, -t TOKENIZER alone gives the tokenizer's views, and nothing at all
    the worked examples. The first line printed is the page's address. Ctrl-C stops it.

    \b
    Examples:
      tk serve runs/demo
      tk serve runs/demo -c gpt2/tokenizer.safetensors --port 8800
      tk serve -t tok.safetensors --no-browser
    """
    check_device(device)
    server = make_server(
        source, tokenizer=tokenizer_path, compare=compare_path, host=host, port=port, device=device, quiet=quiet
    )
    with server:
        click.echo(f"serving {server.url}")
        sys.stdout.flush()
        if not is_loopback(host):
            click.echo(
                f"warning: listening on {host}: other machines can open the page and run the model (no login); "
                "they reach it by IP address",
                err=True,
            )
        if not no_browser:
            open_browser(server.url)
        server.serve_forever()
    return 0


COMMANDS = (serve_command,)
