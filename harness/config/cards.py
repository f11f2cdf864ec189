"""The cards a CUDA shape can be priced for where no GPU is (`parallelism.card`, `--card h100-sxm`): each one's
datasheet rates, memory and links, with where they come from, and the names a user gives them. Data the config's
rules check a name against; the pricing (datasheet scaled by what a lent GPU measured) is
studies/predict/cards.py's."""
from __future__ import annotations

from typing import Dict, List, Optional

# each card: dense bf16 and fp32 (non-tensor-core) TFLOP/s, HBM GB/s and GiB, bus bandwidth a GPU each way
# inside a node and across nodes (GB/s), the names the command line takes
CARDS: Dict[str, dict] = {
    "h100_96gb_hbm2e": {"label": "H100 SXM 96GB HBM2e (500 W)", "tflops": 989.4, "fp32_tflops": 66.9,
                        "mem_gbps": 2400, "gib": 96, "intra_gbps": 450, "inter_gbps": 50, "names": ["h100-96gb"],
                        "source": "torchtitan's benchmark: 2.4 TB/s HBM2e, 400 Gb/s RDMA a GPU, "
                        "NVLink (H100's 900 GB/s both ways); the SXM peak, as its MFU footnote uses, though at 500 W "
                        "the chip runs below it"},
    "h100_80gb": {"label": "H100 SXM 80GB", "tflops": 989.4, "fp32_tflops": 66.9, "mem_gbps": 3350, "gib": 80,
                  "intra_gbps": 450, "inter_gbps": 50, "names": ["h100-sxm", "h100"],
                  "source": "NVIDIA's H100 datasheet (SXM5); links as a DGX H100 (one 400 Gb/s NIC a GPU), which the "
                            "llm-foundry table does not state"},
    "h200": {"label": "H200 SXM 141GB", "tflops": 989.4, "fp32_tflops": 66.9, "mem_gbps": 4800, "gib": 141,
             "intra_gbps": 450, "inter_gbps": 50, "names": ["h200-sxm"],
             "source": "NVIDIA's H200 datasheet; the submission's 400 Gb/s CX-7 a GPU"},
    "a100_80gb": {"label": "A100 SXM 80GB", "tflops": 312.0, "fp32_tflops": 19.5, "mem_gbps": 2039, "gib": 80,
                  "intra_gbps": 300, "inter_gbps": 25, "names": ["a100-80gb", "a100"],
                  "source": "NVIDIA's A100 datasheet (NVLink 3: 600 GB/s both ways); 200 Gb/s HDR a GPU across "
                            "nodes assumed, as the torchtitan document does not state it"},
    "h100_pcie": {"label": "H100 PCIe 80GB", "tflops": 756.5, "fp32_tflops": 51.2, "mem_gbps": 2000, "gib": 80,
                  "intra_gbps": 64, "inter_gbps": 50, "names": ["h100-pcie"],
                  "source": "NVIDIA's H100 datasheet (PCIe: 1,513 TFLOP/s bf16 with sparsity, half without; 2 TB/s "
                            "HBM2e); between GPUs PCIe Gen5 x16 (128 GB/s both ways), as an NVLink bridge joins "
                            "only pairs; one 400 Gb/s NIC a GPU assumed"},
    "b200": {"label": "B200 (HGX, 1000 W)", "tflops": 2250.0, "fp32_tflops": 80.0, "mem_gbps": 8000, "gib": 180,
             "intra_gbps": 900, "inter_gbps": 50, "names": ["b200"],
             "source": "NVIDIA's HGX B200 datasheet (4.5 PFLOP/s bf16 with sparsity, half without; 8 TB/s HBM3e, "
                       "180 GB usable a GPU; NVLink 5's 1.8 TB/s both ways); one 400 Gb/s CX-7 a GPU"},
}


def names() -> str:
    """Every name the command line takes, as a refusal lists them."""
    return ", ".join(n for c in CARDS.values() for n in c["names"])


def card_named(name: str) -> Optional[str]:
    """The CARDS key a user's name (`h100-sxm`, or a key itself) stands for, or None."""
    wanted = name.strip().lower()
    return next((key for key, c in CARDS.items() if wanted == key or wanted in c["names"]), None)


def peak(card: dict, precision: str) -> float:
    """The datasheet's dense matmul TFLOP/s in `precision` (fp32 without tensor cores, as torch's default)."""
    return card["fp32_tflops"] if precision == "fp32" else card["tflops"]


def rules(cfg) -> List[str]:
    """A card must be one of the table's, and names a CUDA shape."""
    card, device = cfg.parallelism.card, cfg.parallelism.device
    if card and card_named(card) is None:
        return [f"parallelism.card={card}: not a card the theory knows; use one of {names()}"]
    if card and device != "cuda":
        return [f"parallelism.card={card}: prices a CUDA shape and this one is on {device}; add parallelism=gpu8 "
                "(or parallelism.device=cuda), or leave the card out"]
    return []
