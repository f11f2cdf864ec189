"""The cards the published runs ran on (experiments/published/): each one's datasheet rates and links, with
where they come from, and which committed GPU measurement is which card. Read by the roofline
(studies/predict/published.py) and by the counted-work model's card costs (studies/predict/counted_shapes.py)."""
from __future__ import annotations

from typing import Dict

# each card: dense bf16 TFLOP/s, HBM GB/s, bus bandwidth a GPU each way inside a node and across nodes (GB/s)
CARDS: Dict[str, dict] = {
    "h100_96gb_hbm2e": {"label": "H100 SXM 96GB HBM2e (500 W)", "tflops": 989.4, "mem_gbps": 2400, "intra_gbps": 450,
                        "inter_gbps": 50, "source": "torchtitan's benchmark: 2.4 TB/s HBM2e, 400 Gb/s RDMA a GPU, "
                        "NVLink (H100's 900 GB/s both ways); the SXM peak, as its MFU footnote uses, though at 500 W "
                        "the chip runs below it"},
    "h100_80gb": {"label": "H100 SXM 80GB", "tflops": 989.4, "mem_gbps": 3350, "intra_gbps": 450, "inter_gbps": 50,
                  "source": "NVIDIA's H100 datasheet (SXM5); links as a DGX H100 (one 400 Gb/s NIC a GPU), which the "
                            "llm-foundry table does not state"},
    "h200": {"label": "H200 SXM 141GB", "tflops": 989.4, "mem_gbps": 4800, "intra_gbps": 450, "inter_gbps": 50,
             "source": "NVIDIA's H200 datasheet; the submission's 400 Gb/s CX-7 a GPU"},
    "a100_80gb": {"label": "A100 SXM 80GB", "tflops": 312.0, "mem_gbps": 2039, "intra_gbps": 300, "inter_gbps": 25,
                  "source": "NVIDIA's A100 datasheet (NVLink 3: 600 GB/s both ways); 200 Gb/s HDR a GPU across "
                            "nodes assumed, as the torchtitan document does not state it"},
}


# the card each committed GPU measurement (results/device_costs/cuda.json's machine, torch's device name) is
MEASURED_CARDS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100_80gb"}
