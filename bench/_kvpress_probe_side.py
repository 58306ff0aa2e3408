"""The kvpress half of `bench/kvpress_probes.py`. Runs inside kvpress's own virtual environment.

kvpress 0.5.5 pins transformers < 5.3, so it cannot share the project's interpreter. The parent builds the
probe samples (token ids) with the project's code, writes them with the press settings to a request (JSON)
and runs `<venv>/bin/python bench/_kvpress_probe_side.py request.json`; this script imports only torch,
transformers and kvpress (never the project) and writes one JSON file:

  versions   {"torch", "transformers", "kvpress"}
  results    one entry per (method, sample): {"method", "probe", "index", "answer_ids" (needle: the greedy
             answer's token ids, stop token excluded), "nll" (nll: mean NLL per target token),
             "kept_per_layer" (mean kept keys per KV head after the prefill, per layer),
             "kept_min_per_layer" (the smallest head's count), "sinks_kept_at_end" (fraction of the
             (layer, KV head, position < n_sink) keys still in the cache after the answer / target; None
             for AdaKV, which drops nothing), "seconds"}
  seconds    wall time of the whole side

The pipeline-free equivalent of kvpress's `KVPressTextGenerationPipeline`: the whole prefill (document and
question: the probes' prefill, exactly as the parent rendered it) runs under `with press(model)`, then the
answer is decoded greedily / the target teacher-forced on the resulting `DynamicCache`, with explicit
`position_ids` (kvpress keeps true positions; the cache's physical length is shorter). Prefill-only presses
are left before decoding, as the pipeline does (their nll target is fed in one forward; AdaKV's one token
per forward, see `run_one`); the decode-time presses (`PrefillDecodingPress` with a
`DecodingPress`) stay on while the answer / target is fed one token per forward, since `DecodingPress`
counts forwards, not tokens. Presses that mask instead of dropping (`AdaKVPress`) keep every key and set
`module.masked_key_indices`, which kvpress's patched attention turns into "fake keys" at decode time.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch
from _kvpress_side import prefill_press  # this script's folder is on sys.path: it runs as a script


def n_kept(t: int, ratio: float) -> int:
    """kvpress's `compute_n_kept` (the budget every press here keeps per head)."""
    return max(1, int(t * (1 - ratio)))


def make_press(method: str, req: dict, t: int):
    """The kvpress press for `method` (names as on the parent's side) at the request's settings."""
    from kvpress import DecodingPress, PrefillDecodingPress, SnapKVPress, StreamingLLMPress

    if method == "dense":
        return None
    r, w, k = req["compression_ratio"], req["window"], req["kernel_size"]
    base, _, scope = method.partition("@")

    if not scope:
        return prefill_press(base, req)
    if scope != "prefill_decode" or base not in ("snapkv", "streaming_llm"):
        raise ValueError(f"no kvpress decoding press for method {method!r}")
    # the decoding press's scorer carries no ratio of its own: DecodingPress sets one per event
    scorer = SnapKVPress(window_size=w, kernel_size=k) if base == "snapkv" else StreamingLLMPress(n_sink=req["n_sink"])
    interval = req["decode_interval"]
    decoding = DecodingPress(
        base_press=scorer,
        compression_interval=interval,
        target_size=n_kept(t, r),  # back to the prefill's budget at every event, as the nexus side does
        hidden_states_buffer_size=max(256, interval),
    )
    return PrefillDecodingPress(prefilling_press=prefill_press(base, req), decoding_press=decoding)


def kept_counts(model, cache, t: int) -> tuple[list[float], list[int]]:
    """Per layer: mean and min over KV heads of the keys still attended after the prefill."""
    means, mins = [], []
    for i, layer in enumerate(model.model.layers):
        heads, length = cache.layers[i].keys.shape[1], cache.layers[i].keys.shape[2]
        counts = torch.full((heads,), length, dtype=torch.long)
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        if masked is not None:  # AdaKV: nothing dropped, these (batch, head, position) entries are masked
            b, h, _ = (x.cpu() for x in masked)
            counts -= torch.bincount(h[b == 0], minlength=heads)
        means.append(float(counts.float().mean()))
        mins.append(int(counts.min()))
    return means, mins


def capture_sinks(model, n: int) -> tuple[dict[int, torch.Tensor], list]:
    """Forward hooks that keep each layer's first `n` keys [Hkv, n, D] as the prefill wrote them. Registered
    before the press's own hooks, so they run first and see the keys before compression."""
    store: dict[int, torch.Tensor] = {}

    def hook(module, args, kwargs, output):
        if module.layer_idx not in store:
            store[module.layer_idx] = kwargs["past_key_values"].layers[module.layer_idx].keys[0, :, :n].clone()
        return output

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    return store, handles


def sinks_kept(cache, store: dict[int, torch.Tensor]) -> float:
    """Fraction of the (layer, KV head, sink position) keys still present in `cache` (exact match: gathered
    keys are bit-identical copies)."""
    kept = total = 0
    for i, sink in store.items():
        keys = cache.layers[i].keys[0]  # [Hkv, S, D]
        hit = (keys.unsqueeze(1) == sink.unsqueeze(2)).all(-1).any(-1)  # [Hkv, n]
        kept, total = kept + int(hit.sum()), total + hit.numel()
    return kept / max(total, 1)


def step(model, cache, ids: list[int], start: int) -> torch.Tensor:
    """Feed `ids` at logical positions start.. on `cache`; logits [len(ids), V] float32."""
    inp = torch.tensor([ids])
    pos = torch.arange(start, start + len(ids)).unsqueeze(0)
    return model(input_ids=inp, past_key_values=cache, position_ids=pos, use_cache=True).logits[0].float()


def greedy(model, cache, last: torch.Tensor, t: int, max_new: int, stop: set[int], until=None) -> list[int]:
    """The nexus side's greedy rule (measure.probes.runner): argmax, stop before a stop token, at most
    `max_new` tokens, and stop as soon as `until(tokens)` (the expected text is in the decoded answer)."""
    out: list[int] = []
    logits = last
    for _ in range(max_new):
        token = int(logits.argmax())
        if token in stop:
            break
        out.append(token)
        if until is not None and until(out):
            break
        logits = step(model, cache, [token], t + len(out) - 1)[-1]
    return out


def teacher_forced_nll(model, cache, last: torch.Tensor, t: int, target: list[int], one_by_one: bool) -> float:
    """Mean NLL per token of `target` after `last` (the distribution of its first token)."""
    logps = [torch.log_softmax(last, -1)[target[0]]]
    rest = target[:-1]
    if rest:
        if one_by_one:
            logits = torch.cat([step(model, cache, [tok], t + i) for i, tok in enumerate(rest)])
        else:
            logits = step(model, cache, rest, t)
        picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(target[1:]).unsqueeze(-1)).squeeze(-1)
        logps.extend(picked)
    return float(-torch.stack(logps).mean())


def _continue(model, cache, last: torch.Tensor, sample: dict, req: dict, one_by_one: bool):
    """(answer ids, nll) of `sample` on the compressed `cache` (each None where the probe has none)."""
    t = len(sample["prefill"])
    nll = teacher_forced_nll(model, cache, last, t, sample["target"], one_by_one) if sample["target"] else None
    answer_ids = None
    if sample["max_new_tokens"]:
        tokenizer, expected = req["tokenizer"], sample["expected"]
        found = (lambda ids: expected in tokenizer.decode(ids, skip_special_tokens=True)) if expected else None
        answer_ids = greedy(model, cache, last, t, sample["max_new_tokens"], set(req["stop_token_ids"]), found)
    return answer_ids, nll


def run_one(model, sample: dict, method: str, req: dict) -> dict:
    from kvpress import PrefillDecodingPress
    from transformers import DynamicCache

    started = time.perf_counter()
    ids = sample["prefill"]
    t = len(ids)
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    press = make_press(method, req, t)
    decode_time = isinstance(press, PrefillDecodingPress)
    cache = DynamicCache()
    store, handles = capture_sinks(model, req["n_sink"])
    with press(model) if press is not None else contextlib.nullcontext():
        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        for handle in handles:
            handle.remove()
        last = out.logits[0, -1].float()
        means, mins = kept_counts(model, cache, t)
        if decode_time:  # the decoding press stays registered while the answer / target is fed
            answer_ids, nll = _continue(model, cache, last, sample, req, one_by_one=True)
    if not decode_time:  # a prefill-only press is left before decoding, as kvpress's pipeline leaves it
        # AdaKV's fake key must satisfy <q, k> < 0 for every query of the forward (search_hyperplane); for a
        # multi-token forward (G x n queries in head_dim dimensions) no such key need exist and kvpress raises,
        # so its targets are fed one token per forward, as kvpress's own generation loop feeds them
        answer_ids, nll = _continue(model, cache, last, sample, req, one_by_one=method.startswith("ada"))
    # AdaKV masks instead of dropping: every key stays in the cache, so presence says nothing there
    masked = any(getattr(layer.self_attn, "masked_key_indices", None) is not None for layer in model.model.layers)
    return dict(
        method=method,
        probe=sample["probe"],
        index=sample["index"],
        answer_ids=answer_ids,
        nll=nll,
        kept_per_layer=means,
        kept_min_per_layer=mins,
        sinks_kept_at_end=None if masked else sinks_kept(cache, store),
        seconds=time.perf_counter() - started,
    )


def main(request_path: str) -> None:
    started = time.perf_counter()
    req = json.loads(Path(request_path).read_text())
    torch.set_num_threads(req["threads"])
    from importlib.metadata import version

    import kvpress  # noqa: F401  (importing it patches the attention functions AdaKV needs)
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    req["tokenizer"] = AutoTokenizer.from_pretrained(req["model_dir"])  # the same files the parent decodes with
    model = AutoModelForCausalLM.from_pretrained(
        req["model_dir"], dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    results = []
    with torch.no_grad():
        for sample in req["samples"]:
            for method in req["methods"]:
                results.append(run_one(model, sample, method, req))
            done = time.perf_counter() - started
            print(f"kvpress side: {sample['probe']} sample {sample['index']} done at {done:.0f} s", flush=True)
    versions = dict(
        torch=str(torch.__version__), transformers=str(transformers.__version__), kvpress=version("kvpress")
    )
    payload = dict(versions=versions, results=results, seconds=time.perf_counter() - started)
    Path(req["out_path"]).write_text(json.dumps(payload))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: _kvpress_probe_side.py REQUEST.json")
    main(sys.argv[1])
