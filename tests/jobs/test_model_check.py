"""Issue 44, item 4: a job whose model cannot be found is refused before anything is stored, and the hf loader fails
in seconds, not in a minute of hub retries (``agent_runner.model_lookup``).

No test reaches the network: "offline" is ``HF_HUB_OFFLINE=1`` or a hub endpoint that refuses connections
(``HF_ENDPOINT=http://127.0.0.1:9``), and the cache is an empty temporary folder (``HF_HUB_CACHE``)."""

from __future__ import annotations

import socket
import time

import pytest

from agent_runner.model_lookup import ModelNotFound, resolve_model
from db.models import Episode, Job
from tests.cli.test_cli import invoke, local  # noqa: F401  (fixture)

TYPO = "nosuch-model-xyz"
#: what a refusal names: the model, where it looked, and the flag that skips the check
NAMED = (TYPO, "presets", "local Hugging Face cache", "Hugging Face Hub", "--no-model-check")


@pytest.fixture(params=["offline", "unreachable"])
def no_hub(request, monkeypatch, tmp_path):
    """No hub, either way: the offline switch, or an endpoint nothing listens on. An empty cache either way."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if request.param == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # read at import; the cache lookup uses it
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", request.param == "offline")  # read at import, too
    return request.param


def test_resolution_names_every_place_it_looked_and_never_waits(no_hub):
    start = time.monotonic()
    with pytest.raises(ModelNotFound) as err:
        resolve_model(TYPO)
    assert time.monotonic() - start < 5
    text = str(err.value)
    assert all(part in text for part in NAMED[:-1]), text
    assert ("HF_HUB_OFFLINE" in text) == (no_hub == "offline")
    assert resolve_model("tiny").kind == "builtin"
    with pytest.raises(ModelNotFound, match="a local folder './no/such/folder'"):
        resolve_model("./no/such/folder")


def test_a_local_folder_and_a_cached_model_resolve_without_the_hub(no_hub, tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    assert resolve_model(str(folder)).kind == "path"
    snapshot = tmp_path / "hf-cache" / "models--org--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    refs = tmp_path / "hf-cache" / "models--org--cached" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    found = resolve_model("org/cached")
    assert (found.kind, found.path, found.local_only) == ("cache", str(snapshot), True)


def test_submit_refuses_a_model_it_cannot_find_and_stores_nothing(local, tmp_path, no_hub):  # noqa: F811
    db, _ = local
    start = time.monotonic()
    done = invoke("submit", "--backend", "hf", "--model", TYPO, "--suite", "mini", "--db", db.url)
    assert time.monotonic() - start < 10
    assert done.exit_code == 2, done.output
    assert all(part in done.output for part in NAMED), done.output
    assert "nothing was submitted" in done.output
    done = invoke("run", "--backend", "hf", "--model", TYPO, "--db", db.url)
    assert done.exit_code == 2 and TYPO in done.output and "nothing was run" in done.output
    with db.session() as s:
        assert (s.query(Job).count(), s.query(Episode).count()) == (0, 0)
    assert not (tmp_path / "celery-broker.db").exists()  # no message was ever sent


def test_the_check_is_for_hf_models_only_and_the_flag_skips_it(no_hub):
    from nexus_eval.commands._job_flags import JobFlags, job_from_flags

    hf = {"backend": "hf", "model": {"name": TYPO}}
    assert job_from_flags(None, hf, what="x", model_check=False).model.name == TYPO  # --no-model-check
    assert job_from_flags(None, {**hf, "backend": "oracle"}, what="x").model.name == TYPO  # oracle loads no model
    assert not JobFlags(no_model_check=True).model_check and not JobFlags(show=True).model_check
    assert JobFlags().model_check and JobFlags().overrides() == {}


def test_episode_with_a_typo_fails_within_seconds_offline(no_hub):
    start = time.monotonic()
    done = invoke("episode", "--task", "humanfmt__humanfmt-1", "--suite", "mini", "--backend", "hf", "--model", TYPO)
    assert done.exit_code == 2, done.output
    assert all(part in done.output for part in NAMED), done.output
    assert time.monotonic() - start < 10


@pytest.fixture
def silent_hub(monkeypatch, tmp_path):
    """A hub that takes the connection and never answers (what a firewall that drops packets looks like to a
    client once connected): every read waits for its timeout, and a client that retries waits again each time."""
    import huggingface_hub.constants as hub

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)  # the kernel completes each handshake; nothing ever reads or writes
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(hub, "ENDPOINT", endpoint)  # read at import by the hub client
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield endpoint
    server.close()


def test_the_hf_loader_fails_within_seconds_offline(no_hub):
    """What a worker (or ``episode --no-model-check``) runs: the same lookup, no hub retries (it took 53 s)."""
    from agent_runner.config import ModelSpec
    from agent_runner.model_host import load_host

    start = time.monotonic()
    with pytest.raises(ValueError, match=TYPO):
        load_host(ModelSpec(name=TYPO))
    assert time.monotonic() - start < 5


def test_the_hf_loader_gives_a_silent_hub_one_bounded_try(silent_hub):
    """The user's case: a hub that does not answer. One connect and one lookup, each bounded by HUB_TIMEOUT_S
    (3 s), instead of transformers' retries (53 s on the user's machine)."""
    from agent_runner.config import ModelSpec
    from agent_runner.model_host import load_host

    start = time.monotonic()
    with pytest.raises(ValueError, match=TYPO) as err:
        load_host(ModelSpec(name=TYPO))
    assert time.monotonic() - start < 8
    assert silent_hub in str(err.value)
