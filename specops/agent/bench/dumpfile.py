"""One file of SGLang's request dump, read without running anything in it: the checks a file must
pass before a byte of it is read, the inert unpickling, the shape SGLang 0.5.23 writes, and the
prompts spec-bench sends made from it.

A pickle names classes and callables, and loading one calls them: a file that reached this
directory by any other way than the server's own dump could run code as root.  So every global a
dump names becomes an inert Record (it keeps what it was given and does nothing); SGLang's classes
are not imported, none of their code runs, and nothing the file names is ever called.  What is
read of it is data: the request's text or token ids and its max_new_tokens.

The shape (tokenizer_manager._dump_data_to_file): a dict whose "requests" is a list of
(GenerateReqInput, out_dict, created, finished) tuples; anything else is refused whole.
"""
import io
import os
import pickle
import stat

from specops.agent.host import ActionError

REQUEST_CLASS = ("sglang.srt.managers.io_struct", "GenerateReqInput")
MAX_BYTES = 256 << 20  # a dump of 25 requests (dumpdir's chunks) with long prompts is a few MiB
# Opcodes a dump has no use for: extension codes and persistent ids (outside data), and protocol
# 0's class instantiation (INST, OBJ).  A memo index far beyond the file's own size would make the
# loader allocate that much (a 12-byte file can ask for gigabytes).
REFUSED_OPS = {"EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "INST", "OBJ"}
MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


class Refused(ActionError):
    """A dump file specops will not read, or not use: the message names it and why."""


class Record:
    """What a dump's global becomes: it takes any arguments and state and runs nothing."""
    origin = ("", "")

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__.update(args=args, state={}, items={}, listed=[])
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of a class with __slots__
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__["state"] = state if isinstance(state, dict) else {"": state}

    def __setitem__(self, key, value):
        self.__dict__["items"][key] = value

    def append(self, value):
        self.__dict__["listed"].append(value)

    def extend(self, values):
        self.__dict__["listed"].extend(values)


class InertUnpickler(pickle.Unpickler):
    def __init__(self, file):
        super().__init__(file)
        self.classes = {}

    def find_class(self, module, name):
        key = (str(module), str(name))
        if key not in self.classes:  # one class per name: a file that names one a million times makes one
            self.classes[key] = type("Record", (Record,), {"origin": key})
        return self.classes[key]

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a persistent id")


def check_stat(st, where):
    """Why the file `st` describes must not be read (None: it may): SGLang, run as root, writes a
    regular file of root's, with one name, that no one else may write."""
    if stat.S_ISLNK(st.st_mode):
        return "%s: a symbolic link" % where
    if not stat.S_ISREG(st.st_mode):
        return "%s: not a regular file" % where
    if st.st_uid != 0:
        return "%s: owned by uid %d, not root (the server writes its dump as root)" % (where, st.st_uid)
    if st.st_nlink != 1:
        return "%s: has %d names (a hard link to something else)" % (where, st.st_nlink)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "%s: writable by others" % where
    if st.st_size > MAX_BYTES:
        return "%s: %d bytes, more than a dump holds" % (where, st.st_size)
    return None


def read(dir_fd, name, where):
    """The bytes of dump file `name` in the directory `dir_fd`, once it passes check_stat (through
    a descriptor opened without following a link, checked again after the open)."""
    problem = check_stat(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), where)
    if problem:
        raise Refused(problem)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        problem = check_stat(os.fstat(fd), where)
        if problem:
            raise Refused(problem)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)


def load(data, where):
    """The dump's requests, [(request fields, out_dict, created, finished)], from its bytes; a
    truncated pickle (still being written) raises EOFError or pickle.UnpicklingError."""
    scan(data, where)
    try:
        top = InertUnpickler(io.BytesIO(data)).load()
    except (EOFError, pickle.UnpicklingError):
        raise
    except Exception as e:  # noqa: BLE001 (whatever else a crafted file makes the loader meet)
        raise Refused("%s: not a pickle of a request dump (%s)" % (where, type(e).__name__)) from None
    requests = top.get("requests") if isinstance(top, dict) else None
    if not isinstance(requests, list):
        raise Refused("%s: not a request dump (no list of requests in a dict)" % where)
    out = []
    for i, item in enumerate(requests):
        if not (isinstance(item, tuple) and len(item) == 4 and isinstance(item[0], Record)
                and item[0].origin == REQUEST_CLASS and isinstance(item[0].state, dict)
                and isinstance(item[1], dict) and all(isinstance(t, (int, float)) for t in item[2:])):
            raise Refused("%s: request %d is not (GenerateReqInput, output, created, finished)" % (where, i))
        out.append((item[0].state, item[1], float(item[2]), float(item[3])))
    return out


def scan(data, where):
    """Refuse, before loading, a pickle with an opcode a dump has no use for, or a memo index the
    file's size cannot account for (pickletools reads the opcodes and builds nothing)."""
    import pickletools
    limit = len(data) + 1
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in REFUSED_OPS:
                raise Refused("%s: not a pickle of a request dump (it uses %s)" % (where, op.name))
            if op.name in MEMO_OPS and isinstance(arg, int) and arg > limit:
                raise Refused("%s: not a pickle of a request dump (memo index %d)" % (where, arg))
    except ValueError as e:
        if "unknown" in str(e):  # an opcode no pickle has
            raise Refused("%s: not a pickle (%s)" % (where, e)) from None
        raise EOFError(str(e)) from None  # the opcodes end early: still being written


def _tokens(value):
    """A max_new_tokens that is a whole number above 0, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def prompts(fields):
    """The prompts of one dumped request (a batch gives one per item): {"text" | "input_ids",
    "max_new_tokens"}; a request with neither text nor token ids (embeddings, images only) gives none."""
    text, ids, params = fields.get("text"), fields.get("input_ids"), fields.get("sampling_params")
    if isinstance(text, str):
        items = [("text", text)]
    elif isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        items = [("input_ids", ids)]
    elif isinstance(text, list):
        items = [("text", t) for t in text if isinstance(t, str)]
    elif isinstance(ids, list):
        items = [("input_ids", row) for row in ids
                 if isinstance(row, list) and row and all(isinstance(i, int) for i in row)]
    else:
        items = []
    out = []
    for n, (key, value) in enumerate(items):
        p = params[n] if isinstance(params, list) and n < len(params) else params
        out.append({key: value, "max_new_tokens": _tokens(p.get("max_new_tokens")) if isinstance(p, dict) else None})
    return out
