"""Hub downloads through the real huggingface-hub client, offline: a local HTTP endpoint that
serves test GGUF files (HF_ENDPOINT), and a pre-populated cache in a temporary HF_HOME."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Hub(http.server.ThreadingHTTPServer):
    files: dict[str, Path]  # "owner/repo/file" -> local file
    requests: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _lookup(self) -> Path | None:
        # /{owner}/{repo}/resolve/{revision}/{file}
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return None
        return self.server.files.get("/".join(parts[:2] + parts[4:]))  # type: ignore[attr-defined]

    def _headers(self, path: Path) -> None:
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def do_HEAD(self) -> None:
        self.server.requests.append("HEAD " + self.path)  # type: ignore[attr-defined]
        path = self._lookup()
        if path is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.end_headers()
            return
        self._headers(path)

    def do_GET(self) -> None:
        self.server.requests.append("GET " + self.path)  # type: ignore[attr-defined]
        path = self._lookup()
        if path is None:
            self.send_response(404)
            self.end_headers()
            return
        self._headers(path)
        self.wfile.write(path.read_bytes())


@pytest.fixture
def hub(models):
    server = _Hub(("127.0.0.1", 0), _Handler)
    server.files = {"test-org/tiny-GGUF/tiny-a.gguf": models["base"], "test-org/tiny-GGUF/tiny-b.gguf": models["sibling"]}
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def run(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localcos", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
    )


def cached_column(listing: str) -> dict[str, str]:
    """name -> cached, for the test's models in the model table of `models list`."""
    table = listing.split("\n\n")[0].splitlines()[1:]
    return {row.split()[0]: row.split()[1] for row in table if row.startswith("tiny-")}


def config(tmp_path) -> Path:
    f = tmp_path / "models.toml"
    f.write_text(
        '[models.tiny-a]\nrepo = "test-org/tiny-GGUF"\nfile = "tiny-a.gguf"\n\n'
        '[models.tiny-b]\nrepo = "test-org/tiny-GGUF"\nfile = "tiny-b.gguf"\n\n'
        '[ensembles.tiny-pair]\nmodels = ["tiny-a", "tiny-b"]\ncombine = "we"\nweights = [0.5, 0.5]\nmethod = "cos"\ngamma = [2, 1]\n'
    )
    return f


def test_pull_downloads_through_huggingface_hub_then_works_offline(hub, tmp_path, models):
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}", "HF_HOME": str(tmp_path / "hf"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    cfg = str(config(tmp_path))
    listed = run("models", "list", "--config", cfg, env=env)
    assert listed.returncode == 0 and "tiny-a" in listed.stdout
    assert cached_column(listed.stdout) == {"tiny-a": "no", "tiny-b": "no"}

    pulled = run("models", "pull", "tiny-pair", "--config", cfg, env=env)
    assert pulled.returncode == 0, pulled.stderr
    paths = [Path(line.split("\t")[1]) for line in pulled.stdout.splitlines()]
    assert [p.read_bytes() for p in paths] == [models["base"].read_bytes(), models["sibling"].read_bytes()]
    assert all(str(tmp_path / "hf") in str(p) for p in paths)  # in huggingface-hub's cache
    assert any(r.startswith("GET /test-org/tiny-GGUF/resolve/") for r in hub.requests)

    listed = run("models", "list", "--config", cfg, env=env)
    assert cached_column(listed.stdout) == {"tiny-a": "yes", "tiny-b": "yes"}

    # offline now: the preset runs from the cache, with its combiner, method and gamma
    hub.requests.clear()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    out = run("generate", "--preset", "tiny-pair", "--config", cfg, "--prompt", "The river", "--max-tokens", "8", "--json", env=offline)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["method"] == "cos" and stats["gamma"] == [2, 1] and stats["combiner"] == "we(0.5,0.5)"
    assert hub.requests == []
    # and hf: references resolve from the cache as well
    out = run("generate", "--models", "hf:test-org/tiny-GGUF/tiny-a.gguf", "--prompt", "x", "--max-tokens", "2", env=offline)
    assert out.returncode == 0, out.stderr


def test_missing_offline_is_one_clear_line(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    out = run("generate", "--models", "tiny-a", "--config", str(config(tmp_path)), "--prompt", "x", env=env)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "tiny-a (test-org/tiny-GGUF/tiny-a.gguf) is not in the Hugging Face cache" in out.stderr
    assert "localcos models pull tiny-a" in out.stderr


def test_missing_file_on_the_hub(hub, tmp_path):
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}", "HF_HOME": str(tmp_path / "hf")}
    out = run("models", "pull", "hf:test-org/tiny-GGUF/nope.gguf", env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "nope.gguf" in out.stderr


def test_prepopulated_cache(tmp_path, models):
    """A cache laid out as huggingface-hub lays it out (blobs, snapshots, refs) is used as is."""
    repo = tmp_path / "hf" / "hub" / "models--test-org--tiny-GGUF"
    blob = repo / "blobs" / hashlib.sha256(models["base"].read_bytes()).hexdigest()
    blob.parent.mkdir(parents=True)
    shutil.copy(models["base"], blob)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-a.gguf").symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    info = run("models", "info", "tiny-a", "--config", str(config(tmp_path)), env=env)
    assert info.returncode == 0, info.stderr
    assert "architecture    llama" in info.stdout and "1024 tokens" in info.stdout
