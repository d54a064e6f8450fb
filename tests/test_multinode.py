"""Services across nodes without a fleet: each node's rank and rank 0's address from the
inventory, the checks on the nodes, and rolling batches that keep a service's nodes together."""
import pytest
import yaml

from specops import inventory
from specops.errors import UsageError
from specops.kinds import kind_of
from roles import VOCABULARY


def test_a_service_across_nodes_gets_each_node_its_rank_and_rank_0s_address(tmp_path):
    from specops.sglang.spec import launch_args
    svc = {"name": "big", "model_path": "/m", "tp": 2, "nodes": ["a", "b"], "dist_init_port": 40000}
    doc = {"all": {"vars": {"services": [svc]}, "hosts": {"a": {"address": "10.0.0.1", "node_address": "10.1.0.1"},
                                                          "b": {"address": "10.0.0.2"}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    inv = inventory.load(tmp_path, VOCABULARY)
    for rank, name in enumerate(("a", "b")):
        args = launch_args(inv.hosts[name]["services"][0])
        assert args[args.index("--nnodes"):args.index("--nnodes") + 6] == \
            ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.1.0.1:40000"]
    check = kind_of(inv.hosts["b"]["services"][0]).check(inv.hosts["b"], inv.hosts["b"]["services"][0])
    assert check.http is False and kind_of(svc).check(inv.hosts["a"], inv.hosts["a"]["services"][0]).http


def test_a_node_that_is_not_a_host_is_refused(tmp_path):
    doc = {"all": {"hosts": {"a": {"services": [{"name": "big", "model_path": "/m", "nodes": ["a", "zz"]}]}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match="nodes: 'zz' is not a host of the inventory"):
        inventory.load(tmp_path, VOCABULARY)



def test_rolling_batches_never_split_the_nodes_of_a_service(tmp_path):
    from specops import cli
    svc = {"name": "big", "model_path": "/m", "nodes": ["a", "b"]}
    doc = {"all": {"vars": {"services": [svc]}, "hosts": {"a": {}, "b": {}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    hosts = list(inventory.load(tmp_path, VOCABULARY).hosts.values())
    with pytest.raises(UsageError, match="which --serial 1 would put in different batches"):
        cli._same_batch(hosts, 1, 10)
    cli._same_batch(hosts, 2, 10)
    cli._same_batch(hosts, 0, 10)
    with pytest.raises(UsageError, match="more than --forks 1 run at once"):
        cli._same_batch(hosts, 0, 1)


def test_a_node_without_the_service_is_refused(tmp_path):
    doc = {"all": {"hosts": {"a": {"services": [{"name": "big", "model_path": "/m", "nodes": ["a", "b"]}]},
                             "b": {}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match="node 'b' must define service 'big' exactly as the others do"):
        inventory.load(tmp_path, VOCABULARY)


def test_nodes_that_differ_in_anything_but_their_rank_are_refused(tmp_path):
    svc = {"name": "big", "model_path": "/m", "tp": 2, "nodes": ["a", "b"]}
    doc = {"all": {"hosts": {"a": {"services": [svc]}, "b": {"services": [{**svc, "tp": 3}]}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match="exactly as the others do"):
        inventory.load(tmp_path, VOCABULARY)


def test_an_ipv6_rank_0_is_bracketed_and_a_node_named_twice_is_refused(tmp_path):
    """Issue 24, item 6: SGLang splits --dist-init-addr at its last ':'; an IPv6 address goes in
    brackets (seen red without them: 'fd00::1:40000').  A node named twice is not two nodes."""
    from specops.sglang.spec import launch_args
    svc = {"name": "big", "model_path": "/m", "tp": 2, "nodes": ["a", "b"], "dist_init_port": 40000}
    doc = {"all": {"vars": {"services": [svc]}, "hosts": {"a": {"address": "fd00::1"}, "b": {"address": "fd00::2"}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    args = launch_args(inventory.load(tmp_path, VOCABULARY).hosts["b"]["services"][0])
    assert args[args.index("--dist-init-addr") + 1] == "[fd00::1]:40000"
    doc["all"]["vars"]["services"] = [{**svc, "nodes": ["a", "a"]}]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match="nodes must name two or more different hosts"):
        inventory.load(tmp_path, VOCABULARY)
