"""`inv sandbox.traffic`'s input, without a fleet: a bad acceptance or a missing inventory is one
line, said before anything is sent or written."""
import pytest

from sandbox import fleet, traffic
from specops.errors import UsageError


@pytest.mark.parametrize("rate", ["2", "-0.1", "half"])
def test_a_bad_acceptance_is_refused_before_anything(rate):
    """Read before traffic() runs, as a usage error (exit 2: tests/test_usage_errors.py)."""
    with pytest.raises(UsageError, match=rf"--accept-rate: give a number from 0 to 1, or off \(got {rate}\)"):
        traffic.accept_rate(rate)
    assert [traffic.accept_rate(t) for t in ("", "off", "0.2")] == [None, "off", 0.2]


def test_an_inventory_sandbox_up_did_not_write_is_said_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "DEFAULT_SITE", fleet.Site("sox", "192.168.250", tmp_path, tmp_path))
    (tmp_path / "hosts.yml").write_text("all: {hosts: {}}\n")
    with pytest.raises(ValueError, match=r"hosts.yml: not the inventory `inv sandbox.up` wrote \(KeyError"):
        traffic.traffic(None, 0)


def test_the_sandbox_key_and_inventory_are_roots_alone(tmp_path):
    from sandbox import provision
    site = fleet.Site("soy", "192.168.251", tmp_path)  # never booted: only its state directory is used
    key = provision.site_key(site)
    assert key.startswith("sk-sandbox-") and provision.site_key(site) == key  # made once
    assert (tmp_path / "api_key").stat().st_mode & 0o777 == 0o600
