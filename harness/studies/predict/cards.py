"""The cards a prediction can be priced for: each one's datasheet rates, memory and links, with where they come
from, the names a user gives them (`--card h100-sxm`, `parallelism.card`), and which committed GPU measurement is
which card. Read by the roofline (card_rates, rates: studies/predict/rates.py for estimate and advise,
studies/predict/published.py for the published rows) and by the counted-work model's card costs
(studies/predict/counted_shapes.py).

Nothing runs at its datasheet peak, so a card's rates are its datasheet's scaled by measured ÷ datasheet on the
card a lent GPU measured last (results/device_costs/cuda.json): the matmul rate by the matmul ratio in that
precision, the copy rate by the memory-bandwidth ratio. The datasheet's alone where nothing is committed."""
from __future__ import annotations

from ...config.cards import CARDS, card_named, names, peak  # noqa: F401 (the table, re-exported)

# the card each committed GPU measurement (results/device_costs/cuda.json's machine, torch's device name) is
MEASURED_CARDS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100_80gb"}


def card_rates(name: str, precision: str = "bf16") -> dict:
    """A card's matmul TFLOP/s in `precision` and copy GB/s as the time model takes them: measured where the
    committed GPU measurement is this card; otherwise its datasheet's, scaled by measured ÷ datasheet on the
    measured card; the datasheet's alone where nothing is committed. {"tflops", "mem_gbps", "how", "measured": whether
    a GPU measurement priced them}."""
    from ...reporting.time_and_comm import committed_gpu_rates

    card, measured = CARDS[name], committed_gpu_rates()
    kind = MEASURED_CARDS.get(measured["machine"]) if measured and precision in measured["tflops"] else None
    if kind is None:
        return {"tflops": peak(card, precision), "mem_gbps": card["mem_gbps"], "how": "its datasheet's",
                "measured": False}
    compute = measured["tflops"][precision] / peak(CARDS[kind], precision)
    memory = measured["copy_gbps"] / CARDS[kind]["mem_gbps"]
    how = (f"measured on an {measured['machine']}" if kind == name else
           f"its datasheet's x {compute:.3f} (matmul) and x {memory:.3f} (copy), measured ÷ datasheet on an "
           f"{measured['machine']}")
    return {"tflops": peak(card, precision) * compute, "mem_gbps": card["mem_gbps"] * memory, "how": how,
            "measured": True}


def rates(name: str, world: int, precision: str = "bf16", intra_gbps: float = 0.0, inter_gbps: float = 0.0,
          table=()):
    """theory/time.Rates for `name`: card_rates, and its links (or those given), or `table`'s measured rows."""
    from ...theory.time import CommTable, Rates

    card, at = CARDS[name], card_rates(name, precision)
    return Rates(tflops=at["tflops"], mem_gbps=at["mem_gbps"], device="cuda", source=at["how"],
                 committed=at["measured"],
                 comm=CommTable(list(table), "cuda", world, intra_gbps or card["intra_gbps"],
                                inter_gbps or card["inter_gbps"]))
