"""What a mixture of experts' routers did in a step, logged beside the loss: the load-balancing loss and how
unevenly the experts were loaded.

Forward hooks on each router (transformers' `*TopKRouter`, whose output is its logits, the chosen weights and
the chosen experts, or DeepSpeed AutoEP's `TokenChoiceTopKRouter`, which replaces it: `logits_keeper`) add up,
per layer, how many of the step's routed copies each expert received and the router's mean probability for
it; the backward's recompute (activation checkpointing) and eval forwards (no grad) are not counted again.
Read once a step, on this rank's tokens (no collective is added to the step, so the counted collectives stay
those of the strategy):

- `moe/aux_loss`: Switch Transformer's load-balancing loss as transformers' load_balancing_loss_func computes
  it over the layers' routers: E · Σ_e f_e · P_e, f_e the fraction of routed copies sent to expert e and P_e
  its mean router probability, over the step's tokens of every layer. 1·k when perfectly balanced.
- `moe/imbalance`: the busiest expert's routed copies over the mean (1 = balanced), the worst layer's: what
  the compute of the busiest expert, and under expert parallelism its rank's all-to-all, scale with.

For the memory profile's steps, and the step whose collectives are counted, the rank keeps its routed copies per
expert, over the layers, for each micro-batch (`take_rows`), so that the summary can say, from every rank's, what
each rank's experts received under expert parallelism (theory/moe.received_shares): the rows a rank's activations
keep (theory/moe.py), and the rows half of its all-to-alls send back (parallel/ep/comm.py).
"""
from __future__ import annotations

from typing import Dict, List

import torch

from .models import ROUTER_CLASS_SUFFIX, moe_modules


class RouterLog:
    def __init__(self, routers: List[torch.nn.Module], num_experts: int):
        self.num_experts = num_experts
        self.counts = [None] * len(routers)  # routed copies per expert, per layer
        self.probs = [None] * len(routers)  # summed router probabilities per expert, per layer
        self.tokens = [0] * len(routers)
        self.forwards: List[torch.Tensor] = []  # routed copies per expert over the layers, per forward (micro-batch)
        for index, router in enumerate(routers):
            router.register_forward_hook(self._hook(index, logits_keeper(router)))

    @classmethod
    def attach(cls, model: torch.nn.Module, model_cfg) -> "RouterLog | None":
        """Hooks on the model's routers, or None for a dense model."""
        if not model_cfg.num_experts:
            return None
        routers = moe_modules(model, ROUTER_CLASS_SUFFIX)
        return cls(routers, model_cfg.num_experts) if routers else None

    def _hook(self, index: int, read):
        # run eagerly under torch.compile: traced into a block's graph, which every layer reuses, its side effects
        # were replayed under the first layer's index (layer 0 counted both layers' copies: measured 2026-12-03).
        # The cost is a graph break at each router call of a compiled block
        @torch.compiler.disable
        def record(module, args, output) -> None:
            if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
                return  # an eval forward, or activation checkpointing's recompute inside the backward
            with torch.no_grad():
                logits, chosen = read(output)
                counts = torch.bincount(chosen.reshape(-1), minlength=self.num_experts).double()
                probs = torch.softmax(logits.detach().float(), dim=-1).sum(0).double()
            self.counts[index] = counts if self.counts[index] is None else self.counts[index] + counts
            self.probs[index] = probs if self.probs[index] is None else self.probs[index] + probs
            self.tokens[index] += logits.shape[0]
            if index == 0 or not self.forwards:  # the first router: a micro-batch's forward begins
                self.forwards.append(torch.zeros(self.num_experts, dtype=torch.double))
            self.forwards[-1] += counts
        return record

    def take_rows(self) -> List[List[int]]:
        """The routed copies each expert received from this rank's tokens over the layers, for each micro-batch's
        forward since the last take; and a fresh count."""
        rows = [[int(n) for n in forward.tolist()] for forward in self.forwards]
        self.step_metrics()
        return rows

    def step_metrics(self) -> Dict[str, float]:
        """The step's figures (module docstring), and a fresh count for the next step."""
        layers = [i for i, c in enumerate(self.counts) if c is not None]
        if not layers:
            return {}
        total_tokens = sum(self.tokens[i] for i in layers)
        counts = sum(self.counts[i] for i in layers)
        probs = sum(self.probs[i] for i in layers)
        aux = self.num_experts * float((counts / total_tokens * probs / total_tokens).sum())
        imbalance = max(float(self.counts[i].max() / self.counts[i].mean()) for i in layers)
        self.counts = [None] * len(self.counts)
        self.probs = [None] * len(self.probs)
        self.tokens = [0] * len(self.tokens)
        self.forwards = []
        return {"moe/aux_loss": aux, "moe/imbalance": imbalance}


def logits_keeper(router: torch.nn.Module):
    """How to read a router call's logits (T x E) and chosen experts (T x k) from its forward hook.
    transformers' routers return (logits, weights, chosen). DeepSpeed AutoEP's router (deepspeed/moe/ep_router.py)
    returns (weights, chosen, tokens per expert): its logits are its gate Linear's output, kept here by a hook
    on the gate, so that nothing is computed or gathered again (a second call would gather ZeRO-3's gate anew)."""
    gate = getattr(router, "gate", None)
    if not isinstance(gate, torch.nn.Module):
        return lambda output: (output[0], output[2])
    kept = {}
    gate.register_forward_hook(lambda module, args, output: kept.__setitem__("logits", output.detach()))
    return lambda output: (kept.pop("logits"), output[1])


def break_at_routers(model: torch.nn.Module) -> None:
    """The graph breaks RouterLog's hooks make in a compiled block (each router's hook runs eagerly), as no-op
    hooks: so that the compiled traces (runtime/compiled/) split a mixture of experts' graphs where the run does."""
    for router in moe_modules(model, ROUTER_CLASS_SUFFIX):
        router.register_forward_hook(torch.compiler.disable(lambda module, args, output: None))
