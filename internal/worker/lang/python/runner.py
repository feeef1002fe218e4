"""brisk's Python runner: loads a function from source and serves it over HTTP/1.1.

Run as `/usr/bin/python3 -B -s runner.py`. Configuration comes from the
environment:

  PORT               TCP port to listen on (8080 when unset)
  BRISK_LISTEN_HOST  address to bind (127.0.0.1)
  BRISK_CODE_DIR     the function's unpacked code: the working directory and
                     the first entry of sys.path (in place of the runner's
                     own directory)
  BRISK_HANDLER      MODULE.FUNCTION; the module may be dotted (pkg.mod.fn)
  BRISK_CONTRACT     "lambda" (AWS Lambda's handler(event, context), the
                     default) or "http" (OpenFaaS python3-http's
                     handle(event, context))
  BRISK_FUNCTION     the function's name (AWS_LAMBDA_FUNCTION_NAME when unset)
  BRISK_TIMEOUT_MS   the call timeout, for get_remaining_time_in_millis
                     (300000)
  BRISK_MEMORY_MB    memory_limit_in_mb (128)

The handler is imported before the port is bound: brisk's readiness probe is
a TCP connect, so a function that cannot load never listens. It prints the
traceback, then as its last line of stderr "brisk: cannot load handler H:
Type: message", and exits with status 1.

Loading (load_handler) and serving (serve) are separate and nothing before
serve starts a thread or opens a socket, so a fork server can import the
function once in a template process and fork children that each serve.

Cold start matters more than anything here: the runner imports only json
(~6 ms with re, which the function most likely needs anyway), _socket and
_thread (socket and threading would cost ~2.5 ms more, for classes the runner
does not use) and binascii; traceback is imported the first time something
fails, decimal and logging never (the function's are used if it imported
them). The HTTP/1.1
server is a small hand-written one (http.server and email cost ~30 ms): each
connection is served on its own thread, with keep-alive, Content-Length and
chunked request bodies, HTTP/1.0, Connection: close and Expect:
100-continue; every reply has a Content-Length (but 204 and 304, which have
no body) and is written with one sendall.
"""

import sys
import os
import time
import json
import _socket
import _thread
import binascii

MAX_HEAD = 64 << 10  # request line and header lines (431 beyond)
MAX_BODY = 64 << 20  # request body (413 beyond)
MAX_LINE = 4096  # a chunk-size line or a trailer line
# A connection idle (or stalled) this long is closed, as Node's
# keepAliveTimeout does; brisk's proxy drops idle ones sooner or probes them.
IDLE_TIMEOUT = 65.0

JSON = "Content-Type: application/json\r\n"
TEXT = "Content-Type: text/plain; charset=utf-8\r\n"
OCTETS = "Content-Type: application/octet-stream\r\n"

_REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
    206: "Partial Content", 301: "Moved Permanently", 302: "Found", 303: "See Other",
    304: "Not Modified", 307: "Temporary Redirect", 308: "Permanent Redirect",
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 410: "Gone", 413: "Content Too Large",
    415: "Unsupported Media Type", 422: "Unprocessable Content", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
    501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout", 505: "HTTP Version Not Supported",
}

# Set by load_handler.
_handler = None  # the user's function
_call = None  # _lambda_call or _http_call
_function = ""
_timeout = 300.0  # seconds
_memory = 128
_arn = ""
_log_group = ""
_log_stream = ""  # set by serve: one per serving process

_loads = json.loads
_monotonic = time.monotonic
_MISSING = object()
_traceback = None


def _tb():
    """The traceback module, imported the first time something fails."""
    global _traceback
    if _traceback is None:
        import traceback
        _traceback = traceback
    return _traceback


def _json_default(o):
    # Lambda's runtime encodes a Decimal (DynamoDB's numbers) as a float;
    # decimal is looked up, not imported, as only a function using it has one.
    dec = sys.modules.get("decimal")
    if dec is not None and isinstance(o, dec.Decimal):
        return float(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


_dumps = json.JSONEncoder(default=_json_default).encode


# ---------------------------------------------------------------- loading


def load_handler():
    """Imports the handler BRISK_HANDLER names and returns it. On failure it
    prints the traceback and the one-line reason, and exits with status 1."""
    global _handler, _call, _function, _timeout, _memory, _arn, _log_group
    env = os.environ
    # print() in the function is its log: line-buffered even into a pipe.
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    _function = env.get("BRISK_FUNCTION") or env.get("AWS_LAMBDA_FUNCTION_NAME") or ""
    _timeout = _int(env.get("BRISK_TIMEOUT_MS"), 300000) / 1000.0
    _memory = _int(env.get("BRISK_MEMORY_MB"), 128)
    _arn = "arn:aws:lambda:brisk:000000000000:function:" + _function
    _log_group = "/aws/lambda/" + _function
    name = env.get("BRISK_HANDLER", "")
    importing = False  # whether the error is the module's (its traceback is worth printing)
    try:
        contract = env.get("BRISK_CONTRACT") or "lambda"
        if contract == "lambda":
            _call = _lambda_call
        elif contract == "http":
            _call = _http_call
        else:
            raise ValueError(f'contract "{contract}" is not "lambda" or "http"')
        code_dir = os.path.abspath(env.get("BRISK_CODE_DIR") or ".")
        # The runner's own directory (the script's, sys.path[0]) is not the
        # function's: the code directory takes its place.
        here = os.path.dirname(os.path.abspath(__file__))
        if sys.path and sys.path[0] and os.path.abspath(sys.path[0]) == here:
            del sys.path[0]
        sys.path.insert(0, code_dir)
        os.chdir(code_dir)
        module, dot, attr = name.rpartition(".")
        if not dot or not module or not attr:
            raise ValueError(f'handler "{name}" is not MODULE.FUNCTION')
        importing = True
        __import__(module)
        importing = False
        fn = getattr(sys.modules[module], attr)
        if not callable(fn):
            raise TypeError(f"{name} is not callable ({type(fn).__name__})")
    except BaseException as e:  # SystemExit or KeyboardInterrupt at import too
        if importing:
            # Without the runner's frame; a SyntaxError prints its line.
            _tb().print_exception(type(e), e, e.__traceback__.tb_next)
        msg = _str(e).replace("\r", " ").replace("\n", " ")
        sys.stderr.write(f"brisk: cannot load handler {name}: {type(e).__name__}{': ' if msg else ''}{msg}\n")
        sys.stderr.flush()
        sys.exit(1)
    _handler = fn
    _lambda_logging()
    return fn


def _lambda_logging():
    # A Lambda function's logging reaches the log through a handler Lambda's
    # runtime puts on the root logger (logger.setLevel(INFO); logger.info(..)
    # shows). The runner does the same when the function imported logging,
    # and costs nothing when it did not.
    logging = sys.modules.get("logging")
    if logging is None or logging.root.handlers:
        return
    h = logging.StreamHandler(sys.stderr)
    f = logging.Formatter("[%(levelname)s]\t%(asctime)s.%(msecs)03dZ\t%(message)s", "%Y-%m-%dT%H:%M:%S")
    f.converter = time.gmtime
    h.setFormatter(f)
    logging.root.addHandler(h)


def _int(s, default):
    """s as a positive integer, else default."""
    try:
        n = int(s) if s else 0
    except ValueError:
        return default
    return n if n > 0 else default


def _str(e):
    try:
        return str(e)
    except BaseException:
        return f"<unprintable {type(e).__name__} object>"


# ---------------------------------------------------------------- serving


def listen():
    """The listening socket PORT and BRISK_LISTEN_HOST name."""
    host = os.environ.get("BRISK_LISTEN_HOST") or "127.0.0.1"
    port = _int(os.environ.get("PORT"), 8080)
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    s = _socket.socket(family, _socket.SOCK_STREAM)
    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    s.bind((host.strip("[]"), port))
    s.listen(_socket.SOMAXCONN)
    return s


def serve(sock):
    """Accepts connections on the listening socket sock (a socket.socket or
    a _socket.socket) and serves each on its own thread; never returns."""
    global _log_stream
    _log_stream = time.strftime("%Y/%m/%d/", time.gmtime()) + "[$LATEST]" + os.urandom(16).hex()
    accept = sock._accept  # (fd, address): socket.socket's accept without its wrapping
    start = _thread.start_new_thread
    while True:
        try:
            fd, _ = accept()
        except InterruptedError:
            continue
        except OSError:
            time.sleep(0.01)  # EMFILE and the like: do not spin
            continue
        try:
            c = _socket.socket(fileno=fd)
            if c.family != _socket.AF_UNIX:
                c.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            c.settimeout(IDLE_TIMEOUT)
            start(_serve_conn, (c,))
        except Exception:
            os.close(fd)


class _Closed(Exception):
    """The peer closed the connection mid-request."""


class _Refuse(Exception):
    """A request the runner refuses: answered with status and the
    connection closed."""

    def __init__(self, status, msg):
        self.status, self.msg = status, msg


def _fill(c, buf, n):
    """Reads from c until buf holds at least n bytes."""
    while len(buf) < n:
        d = c.recv(min(max(n - len(buf), 65536), 1 << 20))
        if not d:
            raise _Closed()
        buf += d


def _line(c, buf):
    """Takes one CRLF-terminated line (a chunk-size or trailer line) from buf."""
    i = buf.find(b"\r\n")
    while i < 0:
        if len(buf) > MAX_LINE:
            raise _Refuse(400, "chunk line too long")
        d = c.recv(65536)
        if not d:
            raise _Closed()
        buf += d
        i = buf.find(b"\r\n")
    if i > MAX_LINE:
        raise _Refuse(400, "chunk line too long")
    line = bytes(buf[:i])
    del buf[: i + 2]
    return line


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _chunked(c, buf):
    """Reads a chunked body from c (buf holds what arrived after the head)."""
    parts = []
    total = 0
    while True:
        size = _line(c, buf).partition(b";")[0].rstrip(b" \t")
        if not size or len(size) > 16 or not _HEX.issuperset(size):
            raise _Refuse(400, "malformed chunk size")
        n = int(size, 16)
        if n == 0:
            break
        total += n
        if total > MAX_BODY:
            raise _Refuse(413, "request body too large")
        _fill(c, buf, n + 2)
        if buf[n : n + 2] != b"\r\n":
            raise _Refuse(400, "malformed chunk")
        parts.append(bytes(buf[:n]))
        del buf[: n + 2]
    trailers = 0
    while True:  # trailer fields: read and dropped
        line = _line(c, buf)
        if not line:
            break
        trailers += len(line)
        if trailers > MAX_HEAD:
            raise _Refuse(431, "trailer section too large")
    return b"".join(parts)


def _serve_conn(c):
    buf = bytearray()
    try:
        while True:
            # The head.
            if buf[:1] in (b"\r", b"\n"):  # empty lines before a request: ignored
                del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]
            end = buf.find(b"\r\n\r\n")
            while end < 0:
                if len(buf) > MAX_HEAD:
                    raise _Refuse(431, "request header too large")
                d = c.recv(65536)
                if not d:
                    return
                buf += d
                if buf[:1] in (b"\r", b"\n"):
                    del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]
                end = buf.find(b"\r\n\r\n")
            if end > MAX_HEAD:
                raise _Refuse(431, "request header too large")
            lines = buf[:end].decode("latin-1").split("\r\n")
            del buf[: end + 4]
            req = lines[0].split(" ")
            if len(req) != 3 or not req[0] or not req[1]:
                raise _Refuse(400, "malformed request line")
            method, target, version = req
            if version == "HTTP/1.1":
                keep, http10 = True, False
            elif version == "HTTP/1.0":
                keep, http10 = False, True
            elif version.startswith("HTTP/"):
                raise _Refuse(505, "HTTP version not supported")
            else:
                raise _Refuse(400, "malformed request line")
            hdrs = {}  # lowercased name: value (repeated ones joined with ", ")
            names = {}  # lowercased name: the name as sent
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon or not name or name[-1] in " \t" or name[0] in " \t":
                    raise _Refuse(400, "malformed header line")
                value = value.strip(" \t")
                k = name.lower()
                if k in hdrs:
                    hdrs[k] = hdrs[k] + ", " + value
                else:
                    hdrs[k] = value
                    names[k] = name

            # Connection management.
            conn = hdrs.get("connection")
            ka10 = False
            if conn is not None:
                tokens = [t.strip() for t in conn.lower().split(",")]
                if "close" in tokens:
                    keep = False
                elif http10 and "keep-alive" in tokens:
                    keep = ka10 = True

            # The body.
            te = hdrs.get("transfer-encoding")
            cl = hdrs.get("content-length")
            if te is not None:
                if http10:
                    raise _Refuse(400, "Transfer-Encoding in an HTTP/1.0 request")
                if te.strip().lower() != "chunked":
                    raise _Refuse(501, "unsupported Transfer-Encoding")
                if cl is not None:
                    keep = False  # both framings: chunked wins, the connection ends
                _continue(c, hdrs, buf)
                body = _chunked(c, buf)
            elif cl is not None:
                if "," in cl:  # repeated: the same value, or refused
                    vals = {v.strip() for v in cl.split(",")}
                    if len(vals) != 1:
                        raise _Refuse(400, "conflicting Content-Length")
                    cl = vals.pop()
                if not cl.isdigit() or not cl.isascii():
                    raise _Refuse(400, "malformed Content-Length")
                n = int(cl)
                if n > MAX_BODY:
                    raise _Refuse(413, "request body too large")
                if n:
                    if len(buf) < n:
                        if not http10:
                            _continue(c, hdrs, buf)
                        _fill(c, buf, n)
                    body = bytes(buf[:n])
                    del buf[:n]
                else:
                    body = b""
            else:
                body = b""

            status, head, out = _call(method, target, hdrs, names, body)

            if status == 204 or status == 304:
                head = f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n{head}"
                out = b""
            else:
                head = f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n{head}Content-Length: {len(out)}\r\n"
            if not keep:
                head += "Connection: close\r\n\r\n"
            elif ka10:
                head += "Connection: keep-alive\r\n\r\n"
            else:
                head += "\r\n"
            if method == "HEAD":
                c.sendall(head.encode())
            else:
                c.sendall(head.encode() + out)
            if not keep:
                return
    except _Refuse as e:
        try:
            msg = (e.msg + "\n").encode()
            c.sendall(
                f"HTTP/1.1 {e.status} {_REASONS.get(e.status, '')}\r\n{TEXT}"
                f"Content-Length: {len(msg)}\r\nConnection: close\r\n\r\n".encode() + msg
            )
            _linger(c)
        except OSError:
            pass
    except (_Closed, OSError):
        pass
    except BaseException:  # a bug in the runner: logged, the connection dropped
        try:
            _tb().print_exc()
        except BaseException:
            pass
    finally:
        c.close()


def _continue(c, hdrs, buf):
    # A client waiting for 100 Continue before its body gets it.
    e = hdrs.get("expect")
    if e is not None and e.lower() == "100-continue" and not buf:
        c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def _linger(c):
    # Closing with unread data would reset the connection and could lose the
    # reply: stop writing, read what the client still sends (for a while).
    try:
        c.shutdown(_socket.SHUT_WR)
        c.settimeout(1.0)
        n = 0
        while n < (4 << 20):
            d = c.recv(65536)
            if not d:
                break
            n += len(d)
    except OSError:
        pass


# ---------------------------------------------------------------- lambda


class _ClientContext:
    __slots__ = ("client", "custom", "env")

    def __init__(self, d):
        cl = d.get("client") or d.get("Client")
        self.client = _Client(cl) if isinstance(cl, dict) else None
        self.custom = d.get("custom")
        self.env = d.get("env")


class _Client:
    __slots__ = ("installation_id", "app_title", "app_version_name", "app_version_code", "app_package_name")

    def __init__(self, d):
        self.installation_id = d.get("installation_id")
        self.app_title = d.get("app_title")
        self.app_version_name = d.get("app_version_name")
        self.app_version_code = d.get("app_version_code")
        self.app_package_name = d.get("app_package_name")


class LambdaContext:
    """AWS Lambda's context object."""

    __slots__ = ("aws_request_id", "client_context", "_deadline")
    function_version = "$LATEST"
    identity = None

    def __init__(self, request_id, deadline, client_context):
        self.aws_request_id = request_id
        self._deadline = deadline
        self.client_context = client_context

    @property
    def function_name(self):
        return _function

    @property
    def invoked_function_arn(self):
        return _arn

    @property
    def memory_limit_in_mb(self):
        return _memory

    @property
    def log_group_name(self):
        return _log_group

    @property
    def log_stream_name(self):
        return _log_stream

    def get_remaining_time_in_millis(self):
        ms = int((self._deadline - _monotonic()) * 1000)
        return ms if ms > 0 else 0

    def __repr__(self):
        return (
            f"LambdaContext([aws_request_id={self.aws_request_id},log_group_name={_log_group},"
            f"log_stream_name={_log_stream},function_name={_function},memory_limit_in_mb={_memory},"
            f"function_version=$LATEST,invoked_function_arn={_arn},client_context={self.client_context},"
            f"identity=None])"
        )


def _uuid4():
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _lambda_call(method, target, hdrs, names, body):
    deadline = _monotonic() + _timeout
    rid = hdrs.get("x-call-id") or hdrs.get("x-request-id") or _uuid4()
    if body:
        try:
            event = _loads(body)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            return 400, JSON, _dumps({
                "errorType": "InvalidRequestContentException",
                "errorMessage": f"Could not parse request body into json: {e}",
            }).encode()
    else:
        event = {}
    cc = hdrs.get("x-amz-client-context")
    if cc:
        try:
            d = _loads(binascii.a2b_base64(cc))
            cc = _ClientContext(d) if isinstance(d, dict) else None
        except (ValueError, binascii.Error):
            cc = None
    else:
        cc = None
    try:
        result = _handler(event, LambdaContext(rid, deadline, cc))
    except BaseException as e:
        tb = _tb()
        stack = tb.format_list(tb.extract_tb(e.__traceback__.tb_next))
        return 500, JSON, _lambda_error(_str(e), type(e).__name__, rid, stack)
    try:
        return 200, JSON, _dumps(result).encode()
    except Exception as e:
        return 500, JSON, _lambda_error(f"Unable to marshal response: {_str(e)}", "Runtime.MarshalError", rid, [])


def _lambda_error(msg, etype, rid, stack):
    # As Lambda's runtime logs it.
    log = f"[ERROR] {etype}: {msg}" if msg else f"[ERROR] {etype}"
    if stack:
        log += "\nTraceback (most recent call last):\n" + "".join(stack)
    sys.stderr.write(log if log.endswith("\n") else log + "\n")
    return _dumps({"errorMessage": msg, "errorType": etype, "requestId": rid, "stackTrace": stack}).encode()


# ---------------------------------------------------------------- http


class Headers(dict):
    """The request's header fields by the names they were sent with;
    [], get and in also find a name in any case."""

    __slots__ = ("_lower",)

    def __missing__(self, key):
        if isinstance(key, str):
            v = self._lower.get(key.lower(), _MISSING)
            if v is not _MISSING:
                return v
        raise KeyError(key)

    def get(self, key, default=None):
        v = dict.get(self, key, _MISSING)
        if v is _MISSING:
            return self._lower.get(key.lower(), default) if isinstance(key, str) else default
        return v

    def __contains__(self, key):
        return dict.__contains__(self, key) or (isinstance(key, str) and key.lower() in self._lower)


class Event:
    """The request, as OpenFaaS's python3-http template's event."""

    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, body, headers, method, path, query):
        self.body = body
        self.headers = headers
        self.method = method
        self.path = path
        self.query = query

    def __repr__(self):
        return f"Event(method={self.method!r}, path={self.path!r}, query={self.query!r}, headers={dict(self.headers)!r}, body={self.body!r})"


class HTTPContext:
    __slots__ = ("request_id", "_deadline")

    def __init__(self, request_id, deadline):
        self.request_id = request_id
        self._deadline = deadline

    @property
    def function_name(self):
        return _function

    def get_remaining_time_in_millis(self):
        ms = int((self._deadline - _monotonic()) * 1000)
        return ms if ms > 0 else 0


def _unquote(s):
    """Decodes one query-string name or value (+ is a space)."""
    if "+" in s:
        s = s.replace("+", " ")
    if "%" not in s:
        return s
    parts = s.encode("utf-8", "surrogateescape").split(b"%")
    out = [parts[0]]
    for p in parts[1:]:
        if len(p) >= 2 and p[0] in _HEX and p[1] in _HEX:
            out.append(bytes((int(p[:2], 16),)))
            out.append(p[2:])
        else:
            out.append(b"%")
            out.append(p)
    return b"".join(out).decode("utf-8", "replace")


def _query(qs):
    """name: first value, blank values kept (as Flask's request.args)."""
    q = {}
    for part in qs.split("&"):
        if part:
            k, _, v = part.partition("=")
            k = _unquote(k)
            if k not in q:
                q[k] = _unquote(v)
    return q


def _http_call(method, target, hdrs, names, body):
    deadline = _monotonic() + _timeout
    if target[0] != "/" and "://" in target:  # absolute-form: keep the path
        target = target.partition("://")[2]
        i = target.find("/")
        target = target[i:] if i >= 0 else "/"
    path, q, qs = target.partition("?")
    headers = Headers((names[k], v) for k, v in hdrs.items())
    headers._lower = hdrs
    rid = hdrs.get("x-call-id") or hdrs.get("x-request-id") or _uuid4()
    try:
        r = _handler(Event(body, headers, method, path, _query(qs) if qs else {}), HTTPContext(rid, deadline))
        return _http_reply(r)
    except BaseException as e:
        tb = _tb()
        msg = _str(e)
        text = "".join(tb.format_exception(type(e), e, e.__traceback__.tb_next))
        sys.stderr.write(text)
        return 500, TEXT, f"{type(e).__name__}: {msg}\n".encode()


def _http_reply(r):
    if r is None:
        return 204, "", b""
    if isinstance(r, str):
        return 200, TEXT, r.encode()
    if isinstance(r, (bytes, bytearray, memoryview)):
        return 200, OCTETS, bytes(r)
    if isinstance(r, dict) and ("statusCode" in r or "body" in r or "headers" in r):
        status = r.get("statusCode", 200)
        if isinstance(status, str) and status.isdigit():
            status = int(status)
        if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 999:
            raise ValueError(f"statusCode {status!r} is not an HTTP status from 200 to 999")
        head, ctype = _user_headers(r.get("headers"))
        body = r.get("body")
        if body is None:
            out, default = b"", ""
        elif isinstance(body, str):
            out, default = body.encode(), TEXT
        elif isinstance(body, (bytes, bytearray, memoryview)):
            out, default = bytes(body), OCTETS
        else:
            out, default = _dumps(body).encode(), JSON
        if not ctype:
            head += default
        return status, head, out
    return 200, JSON, _dumps(r).encode()


def _user_headers(h):
    """The header lines of the function's headers (a dict; a list value
    makes one line each), and whether they set Content-Type. Framing
    headers are the runner's and dropped."""
    if not h:
        return "", False
    if not isinstance(h, dict):
        raise TypeError(f"headers must be a dict, not {type(h).__name__}")
    lines = []
    ctype = False
    for k, v in h.items():
        k = str(k)
        lk = k.lower()
        if lk in ("content-length", "transfer-encoding", "connection"):
            continue
        if not _token(k):
            raise ValueError(f"invalid header name {k!r}")
        if lk == "content-type":
            ctype = True
        for v in v if isinstance(v, (list, tuple)) else (v,):
            v = str(v)
            if not v.isprintable() and not _valid_value(v):
                raise ValueError(f"invalid value for header {k}: {v!r}")
            lines.append(f"{k}: {v}\r\n")
    return "".join(lines), ctype


_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _token(s):
    return bool(s) and _TCHAR.issuperset(s)


def _valid_value(v):
    # No control characters but tab (brisk's proxies refuse them).
    for ch in v:
        o = ord(ch)
        if (o < 32 and o != 9) or o == 127:
            return False
    return True


# ---------------------------------------------------------------- template


def template(fd):
    """Serves as the function's template (docs/languages.md): the handler is
    loaded; each fork request on the control socket fd (a SOCK_SEQPACKET
    socket to the worker) becomes a child that serves one sandbox. The
    template reaps its children and reports their exit statuses. Never
    returns: it ends when the worker closes the socket."""
    import _signal
    import ctypes  # noqa: F401 -- for _isolate: imported once here, not in every child

    ctl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fd)

    def send(obj):
        try:
            ctl.send(_dumps(obj).encode())
        except OSError:
            os._exit(0)  # the worker is gone

    def reap(signum, frame):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            send({"op": "exit", "pid": pid, "status": code})

    _signal.signal(_signal.SIGCHLD, reap)
    send({"op": "ready"})
    space = _socket.CMSG_SPACE(4 * 4)
    while True:
        try:
            msg, anc, _, _ = ctl.recvmsg(1 << 20, space)
        except InterruptedError:
            continue
        if not msg:
            os._exit(0)
        fds = []
        for level, kind, data in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                n = len(data) - len(data) % 4
                fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, n, 4)]
        rid = ""
        try:
            req = _loads(msg)
            rid = str(req.get("id", ""))
            if req.get("op") != "fork" or len(fds) != 1:
                raise ValueError("want a fork request with one descriptor (the log)")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
        except Exception as e:
            for f in fds:
                os.close(f)
            send({"op": "error", "id": rid, "error": _str(e)})
            continue
        if pid == 0:
            _child(ctl, req, fds[0])  # never returns
        os.close(fds[0])
        send({"op": "forked", "id": rid, "pid": pid})


def _child(ctl, req, logfd):
    """A template's child becomes one sandbox: its own session (process
    group), log, environment and random state, then it serves."""
    try:
        import _signal

        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        ctl.close()
        os.setsid()
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        os.close(logfd)
        iso = req.get("isolate")
        if iso:
            _isolate(iso)
        env = {}
        for kv in req.get("env") or ():
            k, _, v = kv.partition("=")
            env[k] = v
        os.environ.clear()
        os.environ.update(env)
        # What a fork copies that must differ between sandboxes: random's
        # generator state (os.urandom, secrets and uuid4 read the kernel's,
        # fresh in every process; tempfile reseeds on a new pid).
        rnd = sys.modules.get("random")
        if rnd is not None:
            rnd.seed()
        sock = listen()
    except BaseException as e:
        try:
            os.write(2, f"brisk: template child: {type(e).__name__}: {_str(e)}\n".encode())
        finally:
            os._exit(1)
    try:
        serve(sock)
    finally:
        os._exit(1)


def _isolate(iso):
    """Makes a template's child (native runtime: the template is root of a
    user namespace of its own) a sandbox of its own: private mount, UTS and
    IPC namespaces with a fresh /tmp and /dev/shm and the root read-only,
    its hostname, then no capability at all (locked out by securebits),
    non-dumpable, and the sandbox's seccomp program on top of the
    template's. docs/security.md, "Templates"."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(r, what):
        if r != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")

    CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")
    mb = int(iso.get("tmpfs_mb") or 64)
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={mb}m".encode()), "tmpfs on /tmp")
    if os.path.isdir("/dev/shm"):
        check(libc.mount(b"shm", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"mode=1777,size=65536k"), "tmpfs on /dev/shm")
    check(libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None), "read-only root")
    host = (iso.get("hostname") or "").encode()
    if host:
        check(libc.sethostname(host, len(host)), "hostname")
    PR_SET_SECUREBITS, PR_CAPBSET_DROP, PR_SET_DUMPABLE, PR_SET_SECCOMP = 28, 24, 4, 22
    # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS and NO_CAP_AMBIENT_RAISE, each
    # locked: uid 0 of the user namespace gains nothing by exec again.
    check(libc.prctl(PR_SET_SECUREBITS, 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80, 0, 0, 0), "securebits")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such capability
            check(-1, f"drop capability {cap}")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    SYS_capset = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine)
    if SYS_capset is None:
        raise OSError(f"capset: unknown system call number on {os.uname().machine}")
    check(libc.syscall(SYS_capset, ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "non-dumpable")
    prog = binascii.a2b_base64(iso.get("seccomp") or "")
    if prog:
        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        buf = ctypes.create_string_buffer(prog, len(prog))
        check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))), 0, 0), "seccomp")


def main():
    load_handler()
    fd = os.environ.pop("BRISK_TEMPLATE_FD", "")
    if fd:
        template(int(fd))
    try:
        sock = listen()
    except OSError as e:
        sys.stderr.write(f"brisk: cannot listen: {e}\n")
        sys.exit(1)
    try:
        serve(sock)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
