"""Members of a wheel (a zip) read without holding the wheel: through a seekable file (a wheelhouse
file, or a remote wheel read by range requests: `RangeFile`), or parsed from a stream as it
passes (a server that ignores `Range`: `from_stream`).  Memory stays bounded by the members
wanted, whatever a hostile zip's headers claim: nothing is inflated past the size it is said to
have.  Every member is checked against the sha256 the wheel's RECORD gives it; a wheel without a
RECORD, or a member it does not list, is refused.  Used by wheelfiles.py."""
import hashlib
import struct
import zipfile
import zlib

from specops.agent.converge.httpget import SourceError
from specops.agent.converge.upstream import record_digest_to_hex

MEMBER_MAX = 32 << 20   # bytes a file read from a wheel may have (a model file is a few hundred KB)
ANSWER_MAX = 64 << 20   # bytes the files of one read may have together (they travel in one answer)
DIRECTORY_MAX = 16 << 20  # bytes a wheel's central directory, or its RECORD, may have
CHUNK = 256 << 10       # bytes asked at a time inside a remote wheel
BROKEN = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, struct.error)


def _is_record(name):
    return name.endswith(".dist-info/RECORD") and name.count("/") == 1


def _too_large(name, size, limit=MEMBER_MAX):
    if size > limit:
        raise SourceError("%s is %d MiB, more than the %d MiB a file read from a wheel may have"
                          % (name, size >> 20, limit >> 20))


def _within_answer(members, size):
    held = sum(len(v) for v in members.values() if v is not None)
    if held + size > ANSWER_MAX:
        raise SourceError("the files asked for are more than %d MiB together" % (ANSWER_MAX >> 20))


class RangeFile(object):
    """A wheel on a server that honours `Range`, as the seekable file zipfile reads: each read is
    a range request (CHUNK ahead), the tail (fetched first) and the last span kept."""

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
        if end - self.pos > max(DIRECTORY_MAX, MEMBER_MAX) + CHUNK:
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
        self.spans = [self.spans[0], (start, data)]
        return data


def _read_member(z, info, limit):
    """A member's bytes, never inflated past the size its entry gives (zipfile's CRC check then
    refuses a member whose data says otherwise)."""
    _too_large(info.filename, max(info.file_size, info.compress_size), limit)
    with z.open(info) as f:
        data = f.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise SourceError("%s: its data is not the %d bytes its entry says" % (info.filename, info.file_size))
    return data


def from_zip(fileobj, files):
    """{path: bytes or None} of the members wanted from a seekable zip, each checked against the
    wheel's RECORD."""
    try:
        with zipfile.ZipFile(fileobj) as z:
            out = {}
            for path in files:
                try:
                    info = z.getinfo(path)
                except KeyError:
                    out[path] = None
                    continue
                _too_large(path, max(info.file_size, info.compress_size))
                _within_answer(out, info.file_size)
                out[path] = _read_member(z, info, MEMBER_MAX)
            records = [i for i in z.infolist() if _is_record(i.filename)]
            record = _read_member(z, records[0], DIRECTORY_MAX) if records else None
    except BROKEN as e:
        raise SourceError("not a readable wheel (%s)" % (str(e) or type(e).__name__))
    check_record(record, out)
    return out


def check_record(record, members):
    """Refuse a member whose sha256 is not the one the wheel's RECORD gives it, or that it does not
    list, and a wheel without a RECORD (nothing then says what its files should be)."""
    if not any(v is not None for v in members.values()):
        return
    if record is None:
        raise SourceError("the wheel has no RECORD to check its files against")
    want = {}
    for line in record.decode("utf-8", "replace").splitlines():
        path, _, rest = line.partition(",")
        want[path] = record_digest_to_hex(rest.split(",")[0])
    for path, data in members.items():
        if data is None:
            continue
        if not want.get(path):
            raise SourceError("hash mismatch: the wheel's RECORD gives %s no sha256" % path)
        if hashlib.sha256(data).hexdigest() != want[path]:
            raise SourceError("hash mismatch: %s is not what the wheel's RECORD says" % path)


def _inflate(name, raw, method, size):
    if method == 0:
        return raw
    if method != 8:
        raise SourceError("%s: compression method %d" % (name, method))
    d = zlib.decompressobj(-15)
    data = d.decompress(raw, size + 1)  # never past the size it claims: a bomb stops here
    if len(data) != size or not d.eof:
        raise SourceError("%s: its data is not the %d bytes its entry says" % (name, size))
    return data


def from_stream(read, files, want_sha256):
    """The members wanted, parsed from the whole wheel as `read(n)` streams it past (a server that
    ignores Range): local headers in order, the others skipped, the stream's sha256 checked
    against the index's at its end."""
    wanted, out, record, digest = set(files), {}, None, hashlib.sha256()
    buf = [b""]

    def take(n):
        while len(buf[0]) < n:
            chunk = read(max(1 << 16, n - len(buf[0])))
            if not chunk:
                raise SourceError("the wheel ended inside an entry")
            digest.update(chunk)
            buf[0] += chunk
        data, buf[0] = buf[0][:n], buf[0][n:]
        return data

    try:
        while take(4) == b"PK\x03\x04":  # then the central directory: every entry has passed
            (_, flags, method, _, _, crc, csize, usize, nlen, xlen) = struct.unpack("<HHHHHIIIHH", take(26))
            name = take(nlen).decode("utf-8", "replace")
            take(xlen)  # the extra field: the sizes are in the header proper (zip64 is refused below)
            if flags & 0x08 or 0xFFFFFFFF in (csize, usize):
                raise SourceError("its entries give no sizes in their headers (zip data descriptors or "
                                  "zip64), and the server ignores Range: serve it from one that honours it")
            if name not in wanted and not _is_record(name):
                while csize:
                    csize -= len(take(min(csize, 1 << 16)))
                continue
            _too_large(name, max(csize, usize), DIRECTORY_MAX if _is_record(name) else MEMBER_MAX)
            if not _is_record(name):
                _within_answer(out, usize)
            data = _inflate(name, take(csize), method, usize)
            if zlib.crc32(data) & 0xFFFFFFFF != crc:
                raise SourceError("%s: its CRC is not the one its entry gives" % name)
            if _is_record(name):
                record = data
            else:
                out[name] = data
    except (zlib.error, struct.error) as e:
        raise SourceError("not a readable wheel (%s)" % e)
    while True:  # the rest, for the stream's sha256
        chunk = read(1 << 16)
        if not chunk:
            break
        digest.update(chunk)
    if want_sha256 and digest.hexdigest() != want_sha256.lower():
        raise SourceError("hash mismatch: the wheel is not the sha256 the index gives it")
    got = {path: out.get(path) for path in files}
    check_record(record, got)
    return got
