"""How the agent asks a service: one HTTP request with its API key (from the service's 0600
env file), and the service's secrets kept out of what goes back to the controller."""
from specops.agent.lean import dumps
from specops.agent.services import http
from specops.layout import ADMIN_API_KEY_ENV, API_KEY_ENV, env_file


def call(svc, method, path, body=None, timeout=30, key=None):
    headers = {"Authorization": "Bearer " + key} if key and path not in svc.endpoints.public else {}
    data = dumps(body).encode() if body is not None else None
    res = http.request(svc.host, svc.port, method, path, data, headers, timeout)
    return res.status, res.body


def env_value(line):
    """The value of KEY="..." as specops writes it (\\ " ` $ escaped with a backslash)."""
    value = line.split("=", 1)[1].strip()
    if not (value.startswith('"') and value.endswith('"') and len(value) >= 2):
        return value
    out, chars = [], iter(value[1:-1])
    for ch in chars:
        out.append(next(chars, "") if ch == "\\" else ch)
    return "".join(out)


def secrets(name):
    """Every value in the service's 0600 env file: the API key, HF_TOKEN and the like."""
    try:
        with open(env_file(name)) as f:
            return [env_value(line) for line in f if "=" in line and not line.startswith("#")]
    except OSError:
        return []


def redacted(name, text):
    """The journal tail goes back to the controller: no secret of the service's goes with it."""
    for value in sorted((v for v in secrets(name) if len(v) >= 4), key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def api_key(name, variable=API_KEY_ENV):
    """The service's API key, from its 0600 env file: no secret travels in a request or a manifest."""
    try:
        with open(env_file(name)) as f:
            for line in f:
                if line.startswith(variable + "="):
                    return env_value(line)
    except OSError:
        pass
    return None


def admin_key(name):
    """The key SGLang's admin endpoints take: its admin key where it has one (then the API key is
    refused there), else its API key."""
    return api_key(name, ADMIN_API_KEY_ENV) or api_key(name)
