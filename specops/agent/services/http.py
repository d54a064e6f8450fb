"""A small HTTP/1.1 client: one request per connection, to a service on the host.

http.client (and urllib on top of it) costs the agent ~25 ms of imports on every verify;
a socket costs ~3 (the C socket, lean's, less).  It reads bodies framed by Content-Length,
chunked encoding, or the end of the connection, and caps what it keeps.
"""
from specops.agent.lean import connect

BODY_LIMIT = 8 * 1024 * 1024


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body


def _read_until(sock, buf, sep):
    while sep not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("connection closed in the middle of a response")
        buf += chunk
        if len(buf) > BODY_LIMIT:
            raise OSError("response larger than %d bytes" % BODY_LIMIT)
    return buf.split(sep, 1)


def _read_exactly(sock, buf, n):
    while len(buf) < n:
        chunk = sock.recv(min(65536, n - len(buf)))
        if not chunk:
            raise OSError("connection closed in the middle of a response")
        buf += chunk
    return buf[:n], buf[n:]


def _chunked(sock, buf):
    body = b""
    while True:
        size_line, buf = _read_until(sock, buf, b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return body
        if len(body) + size > BODY_LIMIT:
            raise OSError("response larger than %d bytes" % BODY_LIMIT)
        data, buf = _read_exactly(sock, buf, size + 2)
        body += data[:-2]


def _response_head(sock):
    """(status, lower-cased header fields, what was read past the head)."""
    raw_head, buf = _read_until(sock, b"", b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise OSError("not an HTTP response: %r" % lines[0][:80])
    fields = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        fields[k.strip().lower()] = v.strip()
    return status, fields, buf


def _ascii(host):
    """An ASCII host name as bytes: getaddrinfo encodes a str with the idna codec, ~2 ms of imports."""
    return host.encode("ascii") if host.isascii() else host


def authority(host, port):
    """host:port as a URL and a Host header write it: an IPv6 address in brackets (the one rule,
    inventory/reach.py's too)."""
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def request(host, port, method, path, body=None, headers=None, timeout=30):
    """(status, body bytes) of one request; OSError when nothing answers properly."""
    head = ["%s %s HTTP/1.1" % (method, path), "Host: " + authority(host, port), "Connection: close",
            "Accept: application/json"]
    for k, v in (headers or {}).items():
        head.append("%s: %s" % (k, v))
    if body is not None:
        head += ["Content-Type: application/json", "Content-Length: %d" % len(body)]
    try:
        request_head = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise OSError("a header value is not Latin-1 text")
    sock = connect(_ascii(host), port, timeout)
    try:
        sock.sendall(request_head + (body or b""))
        status, fields, buf = _response_head(sock)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return Response(status, fields, b"")
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return Response(status, fields, _chunked(sock, buf))
        if "content-length" in fields:
            n = int(fields["content-length"])
            if n > BODY_LIMIT:
                raise OSError("response larger than %d bytes" % BODY_LIMIT)
            data, _ = _read_exactly(sock, buf, n)
            return Response(status, fields, data)
        while len(buf) <= BODY_LIMIT:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        return Response(status, fields, buf[:BODY_LIMIT])
    finally:  # (the C socket is no context manager)
        sock.close()


def stream(host, port, path, body, headers, on_event, timeout=60):
    """POST `body` and call on_event(data) for each server-sent event (`data: ...`) as it arrives
    (SGLang's streaming /generate); returns the status.  A non-200 answer's body is not events."""
    head = ["POST %s HTTP/1.1" % path, "Host: " + authority(host, port), "Connection: close",
            "Accept: text/event-stream", "Content-Type: application/json", "Content-Length: %d" % len(body)]
    head += ["%s: %s" % kv for kv in (headers or {}).items()]
    sock = connect(_ascii(host), port, timeout)
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        status, fields, buf = _response_head(sock)
        if status != 200:
            return status
        chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        events = b""
        while True:
            if chunked:
                size_line, buf = _read_until(sock, buf, b"\r\n")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return _dispatch(events, on_event) or status
                data, buf = _read_exactly(sock, buf, size + 2)
                events += data[:-2]
            else:
                data, buf = buf or sock.recv(65536), b""
                if not data:
                    return _dispatch(events, on_event) or status
                events += data
            events = events.replace(b"\r\n", b"\n")
            while b"\n\n" in events:
                event, events = events.split(b"\n\n", 1)
                _dispatch(event, on_event)
            if len(events) > BODY_LIMIT:
                raise OSError("an event larger than %d bytes" % BODY_LIMIT)
    finally:
        sock.close()


def _dispatch(event, on_event):
    """One server-sent event: its data lines joined (a last one without its blank line too)."""
    data = [line[5:].lstrip(b" ") for line in event.replace(b"\r\n", b"\n").split(b"\n")
            if line.startswith(b"data:")]
    if data:
        on_event(b"\n".join(data).strip())
