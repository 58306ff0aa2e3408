"""Why uniform Nexus loses the needle on a real model: what each variant's cache keeps of the needle's tokens.

For each needle sample (``measure.probes``: a fact sentence at 10-90% depth of real filler, the question
after it) the prefill runs once, densely, and is recorded (``nexus.shared_prefill``); every variant's cache is
then the recorded prefill replayed into that method's cache (exact), so the variants see identical keys and
queries and differ only in what they keep. Per variant it reports, over samples:

  needle kept   the fraction of the answer's tokens (the code's digits) still in the cache, mean over layers and
                KV heads (a token a layer dropped cannot be attended to by that layer again)
  whole layers  the fraction of layers in which every KV head still holds every answer token
  kept          cache tokens / prompt tokens (mean over layers and heads)

and, once per sample, how similar the KV heads' keys are: the mean |cosine| between two heads' keys at the
same position, per layer. Near 0 means the heads use unrelated subspaces, so a key averaged over heads (the
paper's literal "head-averaged representations") is a mixture no query was trained against.

    python bench/nexus_gap.py                          # smollm2-135m, 30 samples of 1024 tokens, ~5 min
    python bench/nexus_gap.py --samples 4 --quick      # a smoke run
Accuracy of the same variants is a probe run: docs/methods.md "The Nexus retrieval gap" has both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

from agent_runner.config import SMOLLM2, ModelSpec  # noqa: E402
from agent_runner.model_host import load_host  # noqa: E402
from measure.probes import ProbeSettings, eviction_config  # noqa: E402
from measure.probes.runner import sample_seed  # noqa: E402
from measure.probes.samples import build_sample  # noqa: E402
from nexus.shared_prefill import record_prefill  # noqa: E402

VARIANTS = (
    "snapkv",
    "ada_nexus",
    "nexus",
    "nexus(leftover=unused)",
    "nexus(lam=0)",
    "nexus(block_size=8)",
    "nexus(weight_scale=mean,reservoir_n=200)",
    "nexus(head_scores=per_head)",
    "nexus(head_scores=per_head,weight_scale=mean,reservoir_n=200)",
)


def answer_span(prompt: list[int], answer: list[int]) -> list[int]:
    """Positions of the last occurrence of `answer`'s tokens in `prompt` (the fact, before the question)."""
    for start in range(len(prompt) - len(answer), -1, -1):
        if prompt[start : start + len(answer)] == answer:
            return list(range(start, start + len(answer)))
    raise ValueError("the answer's tokens do not occur in the prompt as one run")


def needle_retention(cache, span: list[int]) -> tuple[float, float]:
    """(mean kept fraction of `span` over layers x KV heads, fraction of layers keeping all of it in every head)."""
    target = torch.tensor(span)
    fractions, whole = [], 0
    for layer in range(cache.num_layers):
        pos = cache.retained_positions(layer)[0]  # [Hkv, slots]
        hit = (pos.unsqueeze(-1) == target).any(-2).float()  # [Hkv, len(span)]
        fractions.append(float(hit.mean()))
        whole += bool(hit.all())
    return sum(fractions) / len(fractions), whole / cache.num_layers


def head_key_similarity(recorded) -> list[float]:
    """Per layer: mean |cos| between the keys of two different KV heads at the same position."""
    out = []
    for _, keys, _, _ in recorded.layers:
        k = torch.nn.functional.normalize(keys[0].float(), dim=-1)  # [Hkv, T, D]
        h = k.shape[0]
        pairs = [(a, b) for a in range(h) for b in range(a + 1, h)]
        out.append(sum(float((k[a] * k[b]).sum(-1).abs().mean()) for a, b in pairs) / max(len(pairs), 1))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--variants", default=";".join(VARIANTS), help="';'-separated probe variants")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 variants")
    ap.add_argument("--out", type=Path, default=Path("bench/out/nexus_gap.json"))
    return ap.parse_args(argv)


@torch.no_grad()
def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    common.set_threads(args.threads)
    variants = ["snapkv", "nexus"] if args.quick else args.variants.split(";")
    settings = ProbeSettings(model=args.model, lengths=(args.length,), samples=args.samples, variants=tuple(variants))
    host = load_host(ModelSpec(name=args.model))
    rows: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    similarity: list[list[float]] = []
    started = time.perf_counter()
    for index in range(args.samples):
        sample = build_sample("needle", host.tokenizer, index, settings)
        seed = sample_seed(settings.seed, index)  # as the probe runner seeds this sample's cells
        span = answer_span(sample.prefill, host.tokenizer.encode(sample.expected, add_special_tokens=False))
        recorded = record_prefill(host.model, torch.tensor([sample.prefill], device=host.device))
        similarity.append(head_key_similarity(recorded))
        for variant in variants:
            cache = recorded.cache_for(eviction_config(variant, "prefill_only", args.density, seed, "paper"))
            kept = sum(cache.occupancy(i) for i in range(cache.num_layers)) / (cache.num_layers * len(sample.prefill))
            rows[variant].append((*needle_retention(cache, span), kept))
        print(f"sample {index + 1}/{args.samples} done ({time.perf_counter() - started:.0f} s)", flush=True)
    summary = {
        v: {k: sum(r[i] for r in rs) / len(rs) for i, k in enumerate(("needle_kept", "whole_layers", "kept"))}
        for v, rs in rows.items()
    }
    layers = len(similarity[0])
    per_layer = [sum(s[i] for s in similarity) / len(similarity) for i in range(layers)]
    table = Table(title=f"needle tokens kept, {args.samples} samples of ~{args.length} tokens, density {args.density}")
    for col in ("variant", "needle kept", "whole layers", "kept"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for v, s in summary.items():
        table.add_row(v, f"{s['needle_kept']:.1%}", f"{s['whole_layers']:.1%}", f"{s['kept']:.1%}")
    Console().print(table)
    print(f"mean |cos| between KV heads' keys at one position: {sum(per_layer) / layers:.3f} "
          f"(per layer min {min(per_layer):.3f}, max {max(per_layer):.3f})")  # fmt: skip
    payload = {
        "model": args.model,
        "samples": args.samples,
        "length": args.length,
        "density": args.density,
        "variants": summary,
        "per_sample": rows,
        "head_key_abs_cos_per_layer": per_layer,
        "seconds": time.perf_counter() - started,
    }
    common.write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
