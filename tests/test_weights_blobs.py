"""A weights file the hub gives no sha256 for (a plain git file, not in LFS: config.json, the
tokenizer) is compared by its git blob sha1: kept at a new commit when the hub's is unchanged,
fetched again when it is not; and the hub listing that sha1 comes from.  No fleet."""
import hashlib
import os

from specops.agent import weights
from support.weights import fetch_again, fetched


def test_a_file_the_hub_gives_no_sha256_for_is_compared_by_its_git_blob_sha1_not_fetched_again(tmp_path):
    """Issue 36 item 5 (c): at a new commit, an unchanged config.json (not in LFS) is kept when its
    git blob sha1 is the hub's; fetched again when it is not, or when the hub gives none."""
    from specops.agent.weights import weightsdir
    dest = tmp_path / "model"
    dest.mkdir(mode=0o755)
    (dest / "config.json").write_bytes(b"hello\n")
    st = (dest / "config.json").stat()
    known = {"size": 6, "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(b"hello\n").hexdigest()}
    blob = "ce013625030ba8dba906f756967f9e9ca394464a"  # `git hash-object` of "hello\n"
    dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert weightsdir.hash_at(dfd, "config.json", git=True) == blob
        f = {"name": "config.json", "size": 6, "sha256": None, "blob": blob}
        assert not weights._stale(dfd, f, known, verify=False, moved_on=True)
        assert not weights._stale(dfd, f, known, verify=True, moved_on=False)
        assert weights._stale(dfd, dict(f, blob="0" * 40), known, verify=False, moved_on=True)
        assert weights._stale(dfd, dict(f, blob=None), known, verify=False, moved_on=True)  # as before: no way to tell
        assert not weights._stale(dfd, dict(f, blob=None), known, verify=False, moved_on=False)
        os.chmod(dest / "config.json", 0o666)  # anyone's to write: not kept, whatever it holds
        assert weights._stale(dfd, f, known, verify=False, moved_on=False)
    finally:
        os.close(dfd)


def test_a_new_commit_fetches_only_what_changed_and_the_manifest_hashes_what_it_did_not_know(tmp_path, monkeypatch):
    """Issue 36 item 5 (c), through the fetch: at a new commit config.json (the hub's git blob
    sha1 unchanged) is not fetched again, and a file kept whose mtime the manifest does not know
    is hashed anew, not given the manifest's old sha256."""
    dest = fetched(tmp_path, monkeypatch, names=("config.json", "tokenizer.json"))
    (dest / "tokenizer.json").write_bytes(b"new tokens")  # edited by hand to what the new commit holds
    said, asked = [], []
    monkeypatch.setattr(weights, "say", said.append)
    monkeypatch.setattr(weights, "tool_python", lambda req: "/nonexistent/python")
    monkeypatch.setattr(weights, "download", lambda *a: asked.append(a))

    def git_sha1(data):
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    info = {"commit": "c2", "files": [
        {"name": "config.json", "size": 110, "sha256": None, "blob": git_sha1(b"config.json" * 10)},
        {"name": "tokenizer.json", "size": 10, "sha256": None, "blob": git_sha1(b"new tokens")}]}
    monkeypatch.setattr(weights, "ask", lambda *a: weights.json.dumps(info))
    res = fetch_again(dest, verify=True)
    assert res["fetched"] == [] and asked == [] and not [s for s in said if "fetched again" in s]
    files = weights.read_manifest(str(dest))["files"]
    assert files["tokenizer.json"]["sha256"] == hashlib.sha256(b"new tokens").hexdigest()
    assert files["config.json"]["sha256"] == hashlib.sha256(b"config.json" * 10).hexdigest()


FAKE_HUB = '''
import os, types
class HfApi:
    def model_info(self, repo, revision, files_metadata):
        listed = os.environ["FAKE_SIZES"] == "1"
        lfs = types.SimpleNamespace(sha256="5" * 64)
        return types.SimpleNamespace(sha="c" * 40, siblings=[
            types.SimpleNamespace(rfilename="config.json", size=6 if listed else None, lfs=None,
                                  blob_id="b" * 40 if listed else None),
            types.SimpleNamespace(rfilename="w.safetensors", size=9 if listed else None, lfs=lfs if listed else None,
                                  blob_id="p" * 40 if listed else None)])
def hf_hub_url(repo, name, revision):
    return name
def get_hf_file_metadata(url):
    plain = url == "config.json"
    return types.SimpleNamespace(size=6 if plain else 9, etag="e" * 40 if plain else "5" * 64)
'''


def test_the_hub_listing_gives_a_plain_git_file_s_blob_sha1_from_the_listing_or_its_etag(tmp_path):
    """Issue 36 item 5 (c): what a file not in LFS is compared by; an LFS file has its sha256 only."""
    import subprocess
    import sys
    from specops.agent.weights import hub
    pkg = tmp_path / "huggingface_hub"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(FAKE_HUB)
    (pkg / "constants.py").write_text("DOWNLOAD_CHUNK_SIZE = 0\n")
    (pkg / "file_download.py").write_text("http_get = None\n")
    (pkg / "utils.py").write_text("build_hf_headers = None\n")
    (pkg / "errors.py").write_text("class GatedRepoError(Exception): pass\nRepositoryNotFoundError = "
                                   "RevisionNotFoundError = GatedRepoError\n")
    for sizes, blob in (("1", "b" * 40), ("0", "e" * 40)):  # listed by the hub; asked of each file's headers
        out = subprocess.run([sys.executable, "-c", hub.HF_SCRIPT, "info"], input='{"repo": "o/n", "revision": "main"}',
                             capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(tmp_path), "FAKE_SIZES": sizes}).stdout
        assert weights.json.loads(out)["files"] == [
            {"name": "config.json", "size": 6, "sha256": None, "blob": blob},
            {"name": "w.safetensors", "size": 9, "sha256": "5" * 64, "blob": None}]
