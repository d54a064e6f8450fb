"""Files of a package version that is not installed, read from its wheel without installing it or
writing a byte: what a diff patch will be applied to in a stack still to be built, checked before
anything moves, and what `inv patch` edits and rebases onto.

The one reader, on both sides: the controller reads its own wheelhouse with it (a wheel file),
the agent the host's package indexes (PEP 503 pages, in the order uv asks them).  From an index
the wheel is read with HTTP range requests: the zip's tail and central directory, then each
wanted member (about 1 MB moved for one file of a 39 MB SGLang wheel).  A server that ignores
`Range` is read as one stream instead, its members parsed as they pass: memory stays bounded by
the largest member wanted, never the wheel.  One deadline holds the whole read, inside every
socket read too (a watchdog shuts the sockets when it passes).  Every member is checked against
the sha256 the wheel's RECORD gives it, and a whole stream against the index's `#sha256`.
"""
import base64
import hashlib
import html
import os
import re
import struct
import zipfile
import zlib
from http.client import HTTPException
from urllib.parse import unquote, urljoin

from specops.agent.converge.httpget import Client, SourceError, Watch, scrub, why  # noqa: F401 (SourceError: for callers)

FAILURES = (OSError, ValueError, HTTPException, zipfile.BadZipFile)  # a fetch that failed, however

TIMEOUT = 60            # seconds a whole read may take (a trickle too)
PAGE_MAX = 8 << 20      # bytes an index page may have
MEMBER_MAX = 32 << 20   # bytes a file read from a wheel may have (a model file is a few hundred KB)
ANSWER_MAX = 64 << 20   # bytes the files of one read may have together (they travel in one answer)
DIRECTORY_MAX = 16 << 20  # bytes a wheel's central directory may have
TAIL = 256 << 10        # bytes asked first from a wheel's end: its central directory, most often
CHUNK = 256 << 10       # bytes asked at a time inside a wheel
class _RangeFile(object):
    """A wheel on a server that honours `Range`, as the seekable file zipfile reads: each read is
    a range request (CHUNK ahead), the last span kept; the tail was fetched first."""

    def __init__(self, client, url, size, tail, tail_at):
        self.client, self.url, self.size, self.pos = client, url, size, 0
        self.spans = [(tail_at, tail)]
        self.moved = len(tail)  # bytes fetched: tests count them

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end - self.pos > DIRECTORY_MAX + CHUNK:
            raise SourceError("a read of %d MiB inside the wheel (its central directory or a member is "
                              "too large)" % ((end - self.pos) >> 20))
        out = b""
        while self.pos < end:
            part = self._cached(self.pos, end)
            if part is None:
                part = self._fetch(self.pos, max(end, min(self.size, self.pos + CHUNK)))[:end - self.pos]
            out += part
            self.pos += len(part)
        return out

    def _cached(self, start, end):
        for at, data in self.spans:
            if at <= start < at + len(data):
                return data[start - at:end - at]
        return None

    def _fetch(self, start, end):
        res = self.client.open(self.url, {"Range": "bytes=%d-%d" % (start, end - 1)})
        with res:
            if res.status != 206:
                raise SourceError("the server stopped honouring Range (status %d)" % res.status)
            data = self.client.read_all(res, end - start)
        if len(data) != end - start:
            raise SourceError("a short range read (%d of %d bytes)" % (len(data), end - start))
        self.moved += len(data)
        self.spans = [self.spans[0], (start, data)]  # the tail (the directory, RECORD) and the last span
        return data


def _from_zip(z, files):
    """{path: bytes or None} of the members wanted, each checked against the wheel's RECORD."""
    out = {}
    for path in files:
        try:
            info = z.getinfo(path)
        except KeyError:
            out[path] = None
            continue
        if info.file_size > MEMBER_MAX or info.compress_size > MEMBER_MAX:
            raise SourceError("%s is %d MiB, more than the %d MiB a file read from a wheel may have"
                              % (path, info.file_size >> 20, MEMBER_MAX >> 20))
        _within_answer(out, info.file_size)
        out[path] = z.read(info)
    records = [n for n in z.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if records and any(v is not None for v in out.values()):
        info = z.getinfo(records[0])
        if info.file_size > DIRECTORY_MAX:
            raise SourceError("its RECORD is %d MiB" % (info.file_size >> 20))
        _check_record(z.read(info), out)
    return out


def _within_answer(members, size):
    held = sum(len(v) for v in members.values() if v is not None)
    if held + size > ANSWER_MAX:
        raise SourceError("the files asked for are more than %d MiB together" % (ANSWER_MAX >> 20))


def _check_record(record, members):
    """Refuse a member whose sha256 is not the one the wheel's RECORD gives it."""
    want = {}
    for line in record.decode("utf-8", "replace").splitlines():
        path, _, rest = line.partition(",")
        algo, _, digest = rest.split(",")[0].partition("=")
        if algo == "sha256" and digest:
            want[path] = digest
    for path, data in members.items():
        if data is None or path not in want:
            continue
        got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if got != want[path].rstrip("="):
            raise SourceError("hash mismatch: %s is not what the wheel's RECORD says" % path)


def _stream(client, res, files, want_sha256):
    """The members wanted, parsed from the whole wheel as it streams past (a server that ignores
    Range): local headers in order, the others skipped; the stream's sha256 checked at its end."""
    wanted, out, record, digest = set(files), {}, None, hashlib.sha256()
    buf = [b""]

    def take(n):
        while len(buf[0]) < n:
            chunk = client.read(res, max(1 << 16, n - len(buf[0])))
            if not chunk:
                raise SourceError("the wheel ended inside an entry")
            digest.update(chunk)
            buf[0] += chunk
        data, buf[0] = buf[0][:n], buf[0][n:]
        return data

    def skip(n):
        while n:
            n -= len(take(min(n, 1 << 16)))

    while True:
        sig = take(4)
        if sig != b"PK\x03\x04":
            break  # the central directory: every entry has passed
        (_, flags, method, _, _, crc, csize, usize, nlen, xlen) = struct.unpack("<HHHHHIIIHH", take(26))
        name = take(nlen).decode("utf-8", "replace")
        take(xlen)  # the extra field: sizes are in the header proper (zip64 refused above)
        if flags & 0x08 or 0xFFFFFFFF in (csize, usize):
            raise SourceError("its entries give no sizes in their headers (zip data descriptors or zip64), "
                              "and the server ignores Range: serve the wheel from a server that honours it")
        is_record = name.endswith(".dist-info/RECORD") and name.count("/") == 1
        if name not in wanted and not is_record:
            skip(csize)
            continue
        if usize > (DIRECTORY_MAX if is_record else MEMBER_MAX) or csize > MEMBER_MAX:
            raise SourceError("%s is %d MiB, more than the %d MiB a file read from a wheel may have"
                              % (name, usize >> 20, MEMBER_MAX >> 20))
        if not is_record:
            _within_answer(out, usize)
        raw = take(csize)
        data = raw if method == 0 else zlib.decompress(raw, -15) if method == 8 else None
        if data is None or zlib.crc32(data) & 0xFFFFFFFF != crc or len(data) != usize:
            raise SourceError("%s: unreadable entry (method %d, or a bad CRC)" % (name, method))
        if is_record:
            record = data
        else:
            out[name] = data
    while True:  # the rest, for the stream's sha256
        chunk = client.read(res, 1 << 16)
        if not chunk:
            break
        digest.update(chunk)
    if want_sha256 and digest.hexdigest() != want_sha256.lower():
        raise SourceError("hash mismatch: the wheel is not the sha256 the index gives it")
    got = {path: out.get(path) for path in files}
    if record is not None:
        _check_record(record, got)
    return got


def _wheel_prefix(dist, version):
    return "%s-%s-" % (re.sub(r"[-_.]+", "_", dist).lower(), version)


def _versions(names, dist):
    norm = re.sub(r"[-_.]+", "_", dist).lower() + "-"
    return sorted({n[len(norm):].split("-")[0] for n in names if n.lower().startswith(norm)},
                  key=lambda v: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+]", v)])


def from_wheelhouse(dist, version, files, wheelhouse):
    """{path: bytes or None} from dist==version's wheel in a wheelhouse directory."""
    prefix = _wheel_prefix(dist, version)
    try:
        names = sorted(n for n in os.listdir(wheelhouse) if n.endswith(".whl"))
    except OSError as e:
        raise SourceError("wheelhouse %s: %s" % (wheelhouse, e.strerror))
    wheel = next((n for n in names if n.lower().startswith(prefix)), None)
    if wheel is None:
        has = _versions(names, dist)
        raise SourceError("wheelhouse %s: no %s %s%s" % (wheelhouse, dist, version,
                                                         " (it has %s)" % ", ".join(has) if has else ""))
    try:
        with zipfile.ZipFile(os.path.join(wheelhouse, wheel)) as z:
            return _from_zip(z, files)
    except zipfile.BadZipFile as e:
        raise SourceError("wheelhouse %s: %s is not a wheel (%s)" % (wheelhouse, wheel, e))


def from_index(dist, version, files, index, watch, stats=None):
    """{path: bytes or None} from dist==version's wheel on a PEP 503 index.  `stats` (a dict)
    gets the bytes moved."""
    client = Client(index, watch)
    project = re.sub(r"[-_.]+", "-", dist).lower()
    with client.open(index.rstrip("/") + "/" + project + "/") as res:
        page, base = client.read_all(res, PAGE_MAX), res.geturl()
    links = []
    for href in re.findall(r"""href=["']([^"']+)["']""", page.decode("utf-8", "replace")):
        href = html.unescape(href)
        links.append((unquote(href.split("#")[0].rsplit("/", 1)[-1]), href))
    prefix = _wheel_prefix(dist, version)
    match = [(n, h) for n, h in links if n.lower().startswith(prefix) and n.endswith(".whl")]
    if not match:
        has = _versions([n for n, _ in links if n.endswith(".whl")], dist)
        raise SourceError("no %s %s there%s" % (dist, version, " (it has %s)" % ", ".join(has[-8:]) if has else ""))
    name, href = match[0]
    want = re.search(r"#sha256=([0-9a-fA-F]{64})", href)
    url = urljoin(base, href)
    res = client.open(url, {"Range": "bytes=-%d" % TAIL})
    with res:
        if res.status == 206:
            total = re.search(r"/(\d+)\s*$", res.headers.get("Content-Range") or "")
            if not total:
                raise SourceError("%s: a range answer without the wheel's size" % name)
            tail = client.read_all(res, TAIL)
            size = int(total.group(1))
            remote = _RangeFile(client, url, size, tail, size - len(tail))
            with zipfile.ZipFile(remote) as z:
                out = _from_zip(z, files)
            moved = remote.moved
        elif res.status == 200:
            out = _stream(client, res, files, want and want.group(1))
            moved = None
        else:
            raise SourceError("%s: status %d" % (name, res.status))
    if stats is not None:
        stats["moved"] = moved
        stats["wheel"] = name
    return out


def read(dist, version, files, indexes=(), wheelhouse=None, timeout=TIMEOUT, stats=None):
    """{path: bytes or None (not in the wheel)} of dist==version: from the wheelhouse when one is
    given (and no index then), else from the first index that has the version.  SourceError
    names every source tried and why it failed."""
    if wheelhouse:
        return from_wheelhouse(dist, version, files, wheelhouse)
    if not indexes:
        raise SourceError("no wheelhouse and no package index to read %s %s from" % (dist, version))
    watch, failed = Watch(timeout), []
    try:
        for index in indexes:
            try:
                return from_index(dist, version, files, index, watch, stats)
            except FAILURES + (SourceError,) as e:
                failed.append("%s: %s" % (scrub(index), scrub(why(e, watch))))
                if watch.expired:
                    break
    finally:
        watch.close()
    raise SourceError("; ".join(failed))


def fact(req):
    """Answer a probe's `wheel_files` (see protocol.Probe): {} when the stack is built already."""
    from specops.agent.converge import stacks
    from specops.agent.host import clean
    if stacks.stack_of(req["stack"]) is not None:
        return {}
    try:
        got = read(req["dist"], req["version"], req["files"], req.get("indexes") or [],
                   timeout=req.get("timeout") or TIMEOUT)
    except (SourceError,) + FAILURES as e:
        return {"error": clean(scrub(str(e)))[-600:]}
    return {path: None if data is None else {"sha256": hashlib.sha256(data).hexdigest(),
                                             "content_b64": base64.b64encode(data).decode()}
            for path, data in got.items()}
