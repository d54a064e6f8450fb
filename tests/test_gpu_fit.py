"""Issue 38, item 3: the plan refuses what the one-round-trip facts already contradict (the GPUs a
service's ranks need, the memory its weights need on each, the driver its torch variant needs),
before anything moves, in --check too.  Facts built here, as the probe gives them; no fleet."""
import base64
import io
import json

import pytest

import roles
from roles import gpu_fit
from specops import inventory, protocol
from specops.ops import Context, Facts, PlanError
from specops.output.report import Redactor, Reporter
from specops.run import HostRun, Options
from specops.sglang import placement
from roles import VOCABULARY

H100 = 81559  # MiB, as nvidia-smi reports an H100 80GB
GiB = 2**30


def gpus(n, mib=H100, driver="575.57.08"):
    return {"present": True, "driver": driver, "unknown": [], "apps": [],
            "gpus": [{"index": str(i), "uuid": f"GPU-{i}", "driver_version": driver, "memory.total": mib,
                      "memory.used": 0} for i in range(n)]}


def hosts(tmp_path, **host_vars):
    """Hosts of an inventory: `name: vars` (a service given as `svc` is the host's only service)."""
    doc = {"all": {"hosts": {name: ({"services": [{"name": "sglang", "model_path": "/models/m", **v.pop("svc")}]}
                                    if "svc" in v else {}) | v for name, v in host_vars.items()}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(doc))
    return inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts


def configs(dtype="bfloat16", paths=("/models/m", "/d")):
    """The checkpoints' config.json as the probe gives them: a dtype SGLang loads as it is stored."""
    doc = base64.b64encode(json.dumps({"torch_dtype": dtype} if dtype else {}).encode()).decode()
    return {f"{p}/config.json": {"exists": True, "type": "file", "content_b64": doc} for p in paths}


def plan(host, gpu, listings=None, weights=None, files=None):
    facts = Facts({"gpu": gpu, "weight_listings": listings or {}, "weights": weights or {},
                   "files": configs() if files is None else files, "venvs": {}})
    return [op.plan(facts, Context(host.name, True)) for op in gpu_fit.ops(host)]


def refusal(host, gpu, **facts):
    with pytest.raises(PlanError) as e:
        plan(host, gpu, **facts)
    return str(e.value)


def test_tp_beyond_the_gpus_nvidia_smi_shows_is_refused_with_what_to_set(tmp_path):
    h = hosts(tmp_path, ct129={"svc": {"tp": 8}})["ct129"]
    assert refusal(h, gpus(4)) == "sglang: tp 8 needs 8 GPUs; ct129 has 4 (nvidia-smi): set tp: 4 or fewer"
    assert [c.summary for c in plan(h, gpus(8))] == ["ok"]
    five = hosts(tmp_path, a={"svc": {"tp": 5}})["a"]  # one more than the host has: refused too
    assert refusal(five, gpus(4)) == "sglang: tp 5 needs 5 GPUs; a has 4 (nvidia-smi): set tp: 4 or fewer"


@pytest.mark.parametrize("check", [True, False])
def test_the_refusal_comes_before_anything_moves_in_check_and_deploy(tmp_path, check):
    """gpu_fit plans first: the models role's push (planned, in a deploy, with its bytes sent at
    once) never comes; in --check the same refusal, from the same facts."""
    local = tmp_path / "weights"
    local.mkdir()
    (local / "config.json").write_text("{}")
    h = hosts(tmp_path, ct129={"svc": {"tp": 8, "weights": {"source": "controller", "path": str(local)}}})["ct129"]
    out = io.StringIO()
    run = HostRun(h, roles.DEPLOY, Options(check=check), Reporter(Redactor([h]), show_diff=True, stream=out))
    pushed = []
    run.push = pushed.append
    facts = Facts({"gpu": gpus(4), "listings": {}, "files": {}, "venvs": {}, "stacks": [],
                   "weights": {"/models/m": {"manifest": None, "differ": [], "present": {}, "partial": {},
                                             "free": 10 * GiB, "device": 1}}})
    with pytest.raises(PlanError, match=r"^sglang: tp 8 needs 8 GPUs; ct129 has 4 \(nvidia-smi\)"):
        run.converge(facts=facts)
    assert run.report.changes == [] and pushed == [] and run.applied == [] and out.getvalue() == ""


def test_dp_pp_and_nodes_are_counted_as_sglang_places_its_ranks(tmp_path):
    h = hosts(tmp_path, ct129={"svc": {"tp": 4, "dp": 2}})["ct129"]
    assert refusal(h, gpus(4)) == ("sglang: tp 4 × dp 2 needs 8 GPUs; ct129 has 4 (nvidia-smi): "
                                   "make tp 4 × dp 2 fit 4 GPUs")
    # DP attention keeps dp inside tp; pipeline stages and --base-gpu-id take GPUs of their own
    assert plan(hosts(tmp_path, a={"svc": {"tp": 4, "dp": 4, "extra_args": ["--enable-dp-attention"]}})["a"], gpus(4))
    h = hosts(tmp_path, a={"svc": {"tp": 2, "extra_args": ["--pp-size", "2", "--base-gpu-id=2"]}})["a"]
    assert refusal(h, gpus(4)) == ("sglang: tp 2 × pp 2 from GPU 2 (--base-gpu-id) needs 6 GPUs; a has 4 "
                                   "(nvidia-smi): make tp 2 × pp 2 from GPU 2 (--base-gpu-id) fit 4 GPUs")
    assert placement.of({"tp": 8, "extra_args": ["--tp-size", "2"]}).per_node() == 2  # the last flag wins
    # only the GPUs CUDA shows it count
    h = hosts(tmp_path, a={"svc": {"tp": 4, "cuda_visible_devices": "2,3,7"}})["a"]
    assert refusal(h, gpus(4)) == ("sglang: tp 4 needs 4 GPUs; a shows it 2 (cuda_visible_devices 2,3,7; "
                                   "nvidia-smi lists 4): set tp: 2 or fewer")


def test_a_service_across_nodes_needs_its_share_of_tp_on_each(tmp_path):
    svc = {"name": "big", "model_path": "/models/big", "tp": 16, "nodes": ["box-a", "box-b"]}
    doc = {"all": {"vars": {"services": [svc]}, "hosts": {"box-a": {}, "box-b": {}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(doc))
    b = inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box-b"]
    assert refusal(b, gpus(4)) == ("big: tp 16 across 2 nodes needs 8 GPUs on each node; box-b has 4 (nvidia-smi): "
                                   "set tp: 8 or fewer")
    assert plan(b, gpus(8))


def test_what_the_facts_do_not_say_is_not_refused(tmp_path):
    h = hosts(tmp_path, a={"svc": {"tp": 8}})["a"]
    mig = gpus(1)
    mig["gpus"][0]["memory.total"] = None  # MIG: CUDA counts its instances, not nvidia-smi's GPUs
    for gpu in ({"present": False}, {"present": True, "error": "NVML: Driver/library version mismatch"}, mig):
        assert plan(h, gpu)
    assert plan(hosts(tmp_path, a={"svc": {"tp": 8, "device": "cpu"}})["a"], gpus(1))
    assert plan(hosts(tmp_path, a={"svc": {"tp": 8, "cuda_visible_devices": "GPU-1,GPU-2"}})["a"], gpus(1))


def shards(gib, n, name="model-{:05d}-of-{:05d}.safetensors"):
    return {name.format(i + 1, n): int(gib * GiB / n) for i in range(n)} | {"config.json": 900}


def test_weights_whose_share_does_not_fit_each_gpu_are_refused(tmp_path):
    h = hosts(tmp_path, ct129={"svc": {"tp": 4, "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d"}}})
    h = h["ct129"]
    big = {"/models/m": shards(320, 64), "/d": shards(2, 1)}
    assert refusal(h, gpus(4), listings=big) == (
        "sglang: its weights need 80.5 GiB on each GPU (/models/m 320.0 GiB + draft /d 2.0 GiB on disk, over tp 4); "
        "ct129's GPUs have 79.6 GiB (nvidia-smi), and SGLang keeps at least 2.0 GiB of each for activations: "
        "use more GPUs (tp), or a smaller or quantized checkpoint")
    assert plan(h, gpus(4), listings={"/models/m": shards(290, 64)})  # 72.5 GiB of 77.6: it fits
    assert plan(h, gpus(4))  # nothing listed: the weights are not there yet, nothing to say
    assert plan(h, gpus(4), listings={"/models/m": shards(300, 1, "consolidated.safetensors") | shards(290, 4)})
    low = hosts(tmp_path, a={"svc": {"tp": 4, "mem_fraction_static": 0.7}})["a"]
    assert refusal(low, gpus(4), listings={"/models/m": shards(290, 4)}).endswith(
        "a's GPUs have 79.6 GiB (nvidia-smi), and mem_fraction_static 0.7 leaves 55.8 GiB of each for weights and "
        "cache: use more GPUs (tp), or a smaller or quantized checkpoint")
    cast = hosts(tmp_path, a={"svc": {"tp": 4, "extra_args": ["--quantization", "fp8"]}})["a"]
    assert plan(cast, gpus(4), listings={"/models/m": shards(320, 4)})  # fp8 on load: not the bytes on disk


def test_a_float32_checkpoint_counts_as_the_16_bits_sglang_loads_it_as(tmp_path):
    """SGLang's dtype auto casts float32 (and a config naming no dtype) to float16: 320 GiB of
    float32 on disk is 160 on the GPUs, 40 on each of 4; unknown is taken as float32 too."""
    h = hosts(tmp_path, ct129={"svc": {"tp": 4}})["ct129"]
    big = {"/models/m": shards(320, 64)}
    assert "its weights need 80.0 GiB on each GPU" in refusal(h, gpus(4), listings=big)
    for files in (configs("float32"), configs(None), {}):
        assert plan(h, gpus(4), listings=big, files=files)
    assert "(float32: half of it as 16-bit)" in refusal(h, gpus(4), listings={"/models/m": shards(700, 64)},
                                                        files=configs("float32"))


def test_weights_with_a_source_count_only_when_the_host_has_that_source(tmp_path):
    source = {"source": "hf", "repo": "org/m", "revision": "main"}
    h = hosts(tmp_path, a={"svc": {"tp": 1, "weights": source}})["a"]
    fetched = {"manifest": {"source": source}, "differ": [], "present": shards(100, 2)}
    assert "its weights need 100.0 GiB on each GPU" in refusal(h, gpus(1), weights={"/models/m": fetched})
    other = {**fetched, "manifest": {"source": {**source, "repo": "org/m-fp8"}}}
    assert plan(h, gpus(1), weights={"/models/m": other})  # a new source will replace them: not known


def test_the_files_sglang_loads_are_the_ones_counted():
    assert placement.weight_bytes({"a.safetensors": 5, "b.safetensors": 5, "pytorch_model.bin": 10}) == 10
    assert placement.weight_bytes({"consolidated.safetensors": 9, "model.safetensors": 8}) == 8
    assert placement.weight_bytes({"pytorch_model.bin": 7, "training_args.bin": 1, "sub/x.safetensors": 3}) == 7
    assert placement.weight_bytes({"config.json": 1}) is None


def test_a_torch_variant_the_driver_cannot_run_is_refused_and_minor_versions_are_not(tmp_path):
    def host(cuda):
        return hosts(tmp_path, box={"torch": {"version": "2.9.1", "cuda": cuda}})["box"]
    assert refusal(host("cu130"), gpus(1)) == (
        "torch cu130 (CUDA 13.0) needs an NVIDIA driver 580 or newer; box has 575.57.08 (nvidia-smi): "
        "set torch.cuda: auto (cu128 here), or upgrade the driver to 580 or newer")
    assert refusal(host("cu121"), gpus(1, driver="470.256.02")) == (
        "torch cu121 (CUDA 12.1) needs an NVIDIA driver 525 or newer; box has 470.256.02 (nvidia-smi): "
        "set torch.cuda to a CUDA 11.x variant, or upgrade the driver to 525 or newer")
    # CUDA's minor version compatibility: any 12.x torch runs on a 525 driver
    assert plan(host("cu128"), gpus(1, driver="535.183.01"))
    assert plan(host("cu130"), {"present": False})
    assert [type(op) for op in gpu_fit.ops(host("auto"))] == []  # auto follows the driver


def test_the_probe_lists_weight_files_on_disk_through_roots_links_only(tmp_path, monkeypatch):
    """probe.weight_listing: regular *.safetensors / *.bin, at most their allocated blocks (a sparse
    file another user planted is not 900 GiB); a link another user owns, or a directory of too
    many names, is not listed (never a refusal, never a huge answer)."""
    import os
    from specops.agent.converge import probe
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x" * 65536)
    with open(d / "huge.bin", "wb") as f:
        f.truncate(900 * GiB)
    (d / "config.json").write_text("{}")
    os.symlink(d / "model.safetensors", d / "linked.safetensors")
    got = probe.weight_listing(str(d))
    assert (got["model.safetensors"] == 65536 and got["huge.bin"] < 2**20
            and set(got) == {"model.safetensors", "huge.bin"})
    link = tmp_path / "theirs"
    os.symlink(d, link)
    os.lchown(link, 1000, 1000)
    assert probe.weight_listing(str(link)) == {} and probe.weight_listing(str(tmp_path / "none")) == {}
    monkeypatch.setattr(probe, "LISTED", 3)
    assert probe.weight_listing(str(d)) == {}
    # a probe's plain listing (gpu_stack's wheelhouse) is another request, of every name: weights
    # only there made the wheelhouse look empty, pushed again on every deploy (seen on the fleet)
    (d / "torch-2.13.0-cp311-none-any.whl").write_bytes(b"w")
    facts = probe.probe(protocol.Probe(listdirs=[str(d)], weight_dirs=[str(d)]))
    assert facts.listings[str(d)]["torch-2.13.0-cp311-none-any.whl"] == 1
    assert "torch-2.13.0-cp311-none-any.whl" not in facts.weight_listings[str(d)]
