"""Where the memory goes: one sentence per run naming what fills its peak, from the memory model's terms at the
moment the model puts the peak (theory/peak.py), e.g. "ds_zero2: 1,910.0 MiB at its peak (inside the
backward), of which 1,907.3 MiB is DeepSpeed's reduce bucket, allocated whole at reduce_bucket_size elements".
The measured peak leads; the split is the prediction's, said as such when the two are more than 10% apart."""
from __future__ import annotations

from typing import List, Optional

from ..config import families

MiB = 2**20
# the theory's moments (theory/peak.PHASES), as a reader knows them
MOMENTS = {"forward_end": "the end of forward", "backward_start": "the start of backward",
           "block_backward": "inside the backward", "gradient_reduce": "the gradient reduction",
           "step": "the optimizer step", "param_gather": "the parameter gather"}
# the theory's terms (theory/peak.py), named for a user: those several families share, then each family's own
TERMS = {"activations": "activations saved for backward",
         "flattened_bucket": "the bucket's flattened copy at the reduce",
         "accumulated_grads": "gradients accumulated between micro-batches",
         "gathered_params": "parameters gathered whole",
         "unsharded_grads": "full gradients waiting for their reduce-scatter",
         "sharded_grads_so_far": "the gradient shards reduced so far", "gloo_clone": "gloo's copy of that input",
         "gloo_allgather_buffer": "gloo's all-gather buffer", "optimizer_temporaries": "AdamW's step temporaries",
         "fp32_slice": "an fp32 gradient slice",
         "grads_not_yet_allocated": "gradients made so far", "grads_so_far": "gradients made so far",
         **{term: name for family in families.every() for term, name in family.term_names.items()}}
# parts that are the model and its data; the others are what a framework adds, worth a word on the run's line
OWN = ("model states", TERMS["activations"])


def parts(figures: dict) -> Optional[tuple[str, dict]]:
    """The moment the model puts the peak at, and the predicted bytes there by part (states, buffers, terms)."""
    at = {m: figures.get(f"memory/peak_at_{m}_predicted_bytes") for m in MOMENTS}
    at = {m: v for m, v in at.items() if v is not None}
    if not at:
        return None
    moment = max(at, key=at.get)
    out = {"model states": figures.get("memory/model_states_device_predicted_bytes") or 0.0,
           "communication and offload buffers": figures.get("memory/buffers_predicted_bytes") or 0.0}
    prefix = f"memory/{moment}_"
    for key, value in figures.items():
        if key.startswith(prefix) and key.endswith("_predicted_bytes") and value:
            term = key[len(prefix):-len("_predicted_bytes")]
            out[TERMS.get(term, term.replace("_", " "))] = value
    return moment, out


def sentence(label: str, figures: dict) -> Optional[str]:
    found = parts(figures)
    measured = figures.get("memory/peak_mem_bytes")
    predicted = figures.get("memory/tensor_peak_predicted_bytes")
    if found is None or not measured or not predicted:
        return None
    moment, by_part = found
    ranked = sorted(((b, name) for name, b in by_part.items() if b > 0), reverse=True)
    if not ranked:
        return None
    (top, top_name), rest = ranked[0], ranked[1:3]
    tail = "".join(f", then {b / MiB:,.1f} MiB {name}" for b, name in rest)
    gap = abs(measured - predicted) / predicted
    caveat = (f" (the split is the prediction's, {predicted / MiB:,.1f} MiB, {100 * gap:.0f}% from the measured "
              "peak)") if gap > 0.10 else ""
    return (f"{label}: {measured / MiB:,.1f} MiB at its peak ({MOMENTS[moment]}), of which {top / MiB:,.1f} MiB "
            f"{top_name}{tail}{caveat}")


def dominant_overhead(figures: dict) -> Optional[str]:
    """For a run's one line: the part a framework adds (a bucket, a buffer) when it alone is over half the
    measured peak, e.g. "1,907.3 MiB of it DeepSpeed's reduce bucket (...)"; else None."""
    found, measured = parts(figures), figures.get("memory/peak_mem_bytes")
    if found is None or not measured:
        return None
    size, name = max((b, n) for n, b in found[1].items())
    return f"{size / MiB:,.1f} MiB of it {name}" if name not in OWN and size > measured / 2 else None


def sentences(rows: List[dict], labels: List[str]) -> List[str]:
    return [s for r, lab in zip(rows, labels) if r.get("status") == "ok"
            for s in [sentence(lab, r.get("figures") or {})] if s]
