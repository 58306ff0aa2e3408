"""The kvpress half of `bench/kvpress_parity.py`. Runs inside kvpress's own virtual environment.

kvpress 0.5.5 pins transformers < 5.3, so it cannot share the project's interpreter. The parent writes a
request (JSON) and runs `<venv>/bin/python bench/_kvpress_side.py request.json`; this script imports only
torch, transformers and kvpress (never the project), and writes one `torch.save` file:

  versions        {"torch", "transformers", "kvpress"}
  dense_prefill   [V] float32 last-position logits of the plain prefill (no press)
  dense_next      [V] float32 logits of the next token over the full cache
  methods[name]   {"kept": bool [L, Hkv, T] (True = position still attended after compression),
                   "kept_counts": long [L, Hkv], "next_logits": [V] float32, "compress_s": [repeats] floats
                   (summed over layers), "prefill_s": [repeats] floats}

Kept positions are recovered from what kvpress really did: for pruning presses by matching every key that
survived in the DynamicCache against the full keys handed to `compress` (gathered copies are bit-identical),
for AdaKVPress from `module.masked_key_indices` (it masks keys at decode time instead of dropping them).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def _match(full: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """bool [Hkv, T]: which of `full` [1, Hkv, T, D] keys appear among `kept` [1, Hkv, n, D] (exact match)."""
    _, h, t, _ = full.shape
    mask = torch.zeros(h, t, dtype=torch.bool)
    for head in range(h):
        eq = (kept[0, head].unsqueeze(1) == full[0, head].unsqueeze(0)).all(-1)  # [n, T]
        hits = eq.sum(-1)
        if not bool((hits == 1).all()):
            raise RuntimeError(f"head {head}: {int((hits != 1).sum())} kept keys match no / several full keys")
        mask[head] = eq.any(0)
    return mask


def prefill_press(name: str, req: dict):
    """The kvpress prefill press for method `name` at the request's settings (`_kvpress_probe_side` uses it too)."""
    from kvpress import AdaKVPress, PyramidKVPress, SnapKVPress, StreamingLLMPress

    r, w, k = req["compression_ratio"], req["window"], req["kernel_size"]
    if name == "snapkv":
        return SnapKVPress(compression_ratio=r, window_size=w, kernel_size=k)
    if name == "pyramidkv":
        return PyramidKVPress(compression_ratio=r, window_size=w, kernel_size=k, beta=req["beta"])
    if name == "streaming_llm":
        return StreamingLLMPress(compression_ratio=r, n_sink=req["n_sink"])
    if name == "ada_snapkv":
        return AdaKVPress(
            SnapKVPress(compression_ratio=r, window_size=w, kernel_size=k), alpha_safeguard=req["alpha_safeguard"]
        )
    raise ValueError(f"no kvpress press for method {name!r}")


def _instrument(press, layers: int, record: dict):
    """Wrap `press.compress` to time it and record each layer's kept mask into `record`."""
    inner = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        t0 = time.perf_counter()
        out_k, out_v = inner(module, hidden_states, keys, values, attentions, kwargs)
        record["seconds"] += time.perf_counter() - t0
        masked = getattr(module, "masked_key_indices", None)
        if masked is not None:  # AdaKV: nothing dropped, these (batch, head, position) entries are masked
            mask = torch.ones(keys.shape[1], keys.shape[2], dtype=torch.bool)
            b, h, s = (t.cpu() for t in masked)
            mask[h[b == 0], s[b == 0]] = False
        else:
            mask = _match(keys, out_k)
        record["kept"][module.layer_idx] = mask
        return out_k, out_v

    press.compress = compress


def main(request_path: str) -> None:
    req = json.loads(Path(request_path).read_text())
    torch.set_num_threads(req["threads"])
    from importlib.metadata import version

    import kvpress  # noqa: F401  (importing it patches the attention functions AdaKV needs)
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    transformers.utils.logging.disable_progress_bar()

    model = AutoModelForCausalLM.from_pretrained(
        req["model_dir"], dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    ids = torch.load(req["ids_path"])
    t = ids.shape[1]
    nxt = torch.tensor([[req["next_token"]]])
    pos = torch.tensor([[t]])  # kvpress keeps true positions: the next token is logical position T
    layers = model.config.num_hidden_layers
    result = dict(
        versions=dict(
            torch=str(torch.__version__), transformers=str(transformers.__version__), kvpress=version("kvpress")
        ),
        methods={},
    )
    with torch.no_grad():
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        result["dense_prefill"] = out.logits[0, -1].float()
        result["dense_next"] = model(input_ids=nxt, past_key_values=cache, position_ids=pos).logits[0, -1].float()
        for name in req["methods"]:
            entry = dict(compress_s=[], prefill_s=[])
            for rep in range(req["repeats"]):
                for layer in model.model.layers:
                    layer.self_attn.masked_key_indices = None
                press = prefill_press(name, req)
                record = dict(seconds=0.0, kept={})
                _instrument(press, layers, record)
                cache = DynamicCache()
                t0 = time.perf_counter()
                with press(model):
                    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                entry["prefill_s"].append(time.perf_counter() - t0)
                entry["compress_s"].append(record["seconds"])
                if rep == 0:
                    kept = torch.stack([record["kept"][i] for i in range(layers)])
                    entry["kept"] = kept
                    entry["kept_counts"] = kept.sum(-1)
                    entry["physical_slots"] = [cache.layers[i].keys.shape[2] for i in range(layers)]
                    logits = model(input_ids=nxt, past_key_values=cache, position_ids=pos).logits
                    entry["next_logits"] = logits[0, -1].float()
            result["methods"][name] = entry
    torch.save(result, req["out_path"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: _kvpress_side.py REQUEST.json")
    main(sys.argv[1])
