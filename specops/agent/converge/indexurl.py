"""A package index's URL (`package_index`, `extra_index`, `torch.index_url`): whether it parses as
every reader takes it alike (`parses`), what text may say of it (`origin`: its scheme and host,
never its user, password or path), and what of it is secret (`secrets`).  One rule on both sides:
the controller's inventory check refuses at load what the agent here would not read, and its
redactor hides what `secrets` names.  Standard library only (it travels with the agent)."""
import re
from urllib.parse import unquote, urlsplit


def parses(url):
    """True when `url` is http(s) with a host, a number for a port, no space or backslash, and no
    @ after the host.  A password's / ? # or space, not percent-encoded, ends the host part early: what is
    left of the user and password would be read as the host and a port, and said as them."""
    if not isinstance(url, str) or any(c.isspace() for c in url):
        return False  # and urlsplit drops a tab or a newline silently: one URL read as another
    if "\\" in url:
        return False  # uv reads a backslash as a slash (WHATWG URLs): its host part would differ
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname)
            and "@" not in parts.path + parts.query + parts.fragment)


def origin(url):
    """What an error may say of an index: scheme://host[:port] (a token may be its user, its
    password or a part of its path), or None for a URL that does not parse (its host part may
    be a password's start)."""
    if not parses(url):
        return None
    parts = urlsplit(url)
    return "%s://%s" % (parts.scheme, parts.netloc.rpartition("@")[2])


def secrets(url):
    """The URL's password, as written and decoded; its user, when it has no password (a token
    given alone); for a URL that does not parse, all between // and the last @."""
    if not isinstance(url, str):
        return []
    if not parses(url):
        torn = re.search(r"//(.*)@", url)
        return [torn.group(1)] if torn else []
    parts = urlsplit(url)
    said = parts.password or parts.username
    return [said, unquote(said)] if said else []
