"""What makes a plan fast must not change it: the advisor's candidates read a plain copy of their config
(config/frozen.py), the peak's sums over blocks are running sums, and the planners' model counts come from the
disk (runtime/model_counts.py). Each is held here to the slow way's answer, exactly."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

from harness.config.compose import backends, compose
from harness.config.frozen import Frozen, node_of, plain

# the configs whose theory takes each family's and each axis's paths: offload, hybrid across nodes, a mixture of
# experts, tensor, context and expert parallelism, LoRA, bf16 under every policy, and DeepSpeed's pass-through keys
SHAPES = [
    [],
    ["train.precision=bf16", "train.activation_checkpointing=selective_op"],
    ["train.precision=bf16", "train.activation_checkpointing=every_k", "train.activation_checkpointing_every=2"],
    ["parallelism.nproc_per_node=4", "parallelism.tp=2", "train.precision=bf16"],
    ["parallelism.nproc_per_node=4", "parallelism.cp=2", "parallelism.seq_len=256"],
    ["model=tiny_qwen3_moe", "parallelism.nproc_per_node=4", "parallelism.ep=2"],
    ["workload=lora", "parallelism.grad_accum=3"],
    ["parallelism.nnodes=2", "parallelism.grad_accum=2", "parallelism.grad_sync=every"],
]


@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_a_frozen_config_predicts_exactly_what_its_config_predicts(shape):
    from harness.config.derive import world_size
    from harness.config.mesh_check import axis_rules
    from harness.config.rules import problems
    from harness.runtime.models import param_count
    from harness.theory.predict import predict

    checked = 0
    for backend in backends():  # the hybrid ones too: their theory is asked at 2 nodes
        cfg = compose([f"backend={backend}", *SHAPES[shape]])
        if problems(cfg, cuda_devices=lambda: 0) or axis_rules(cfg):
            continue  # a run would refuse it: no theory is asked of it
        counts = param_count(cfg.model, cfg.workload)
        world = world_size(cfg)
        assert predict(Frozen.of(cfg), world, counts) == predict(cfg, world, counts), backend
        checked += 1
    assert checked >= 3  # the shape is one some backends run


def test_a_frozen_config_reads_as_its_config_and_cannot_be_written():
    cfg = compose(["backend=ds_zero2", "+backend.deepspeed.zero_optimization.overlap_comm=false"])
    frozen = Frozen.of(cfg)
    assert frozen.parallelism.micro_batch == cfg.parallelism.micro_batch and "model" in frozen
    assert frozen.parallelism.get("no_such_field", 7) == 7 and frozen["train"]["steps"] == cfg.train.steps
    assert plain(frozen.backend.deepspeed) == {"zero_optimization": {"overlap_comm": False}}
    assert node_of(frozen.model) == cfg.model  # what OmegaConf itself must be handed (a merge, to_yaml)
    assert copy.deepcopy(frozen) is frozen and Frozen.of(frozen) is frozen
    with pytest.raises(AttributeError):
        frozen.parallelism.micro_batch = 2
    with pytest.raises(AttributeError):
        frozen.parallelism.no_such_field


def test_the_peaks_running_sums_are_the_sums_block_by_block():
    from harness.theory import activations
    from harness.config.recompute import Recompute

    a = {"layers": 7, "block": 3.25, "block_input": 1.5, "selective_block": 2.0,
         "recompute": Recompute(policy="every_k", every=3, layers=7)}
    for k in range(8):
        assert activations.kept_below(a, k) == sum(activations.kept_by_block(a, j) for j in range(k))
        assert activations.plain_blocks(a, k) == sum(1 for j in range(k) if not a["recompute"].checkpointed(j))


def test_a_mesh_keeps_its_hash_and_its_groups_but_never_pickles_them():
    from harness.config.mesh import Mesh

    mesh = Mesh(per_node=4, nodes=2, tp=2)
    assert mesh.size_and_span("tp") == (2, False) and mesh.size_and_span("dp") == (4, True)
    again = pickle.loads(pickle.dumps(mesh))
    assert "_hash" not in again.__dict__ and "_spans" not in again.__dict__
    assert again == mesh and hash(again) == hash(mesh) and {mesh: 1}[again] == 1
    assert mesh.replace(tp=4) != mesh


def test_the_planners_counts_are_the_runs_counts_and_the_second_ask_reads_the_disk(tmp_path, monkeypatch):
    from harness.runtime import model_counts, models
    from harness.runtime.measure import probes

    monkeypatch.setattr("harness.runtime.compiled.trace_cache.traces_dir", lambda: tmp_path)
    for fn in (model_counts._param_count, model_counts._flops_per_token):
        fn.cache_clear()
    cfg = compose(["workload=lora"])
    runs = models.param_count(cfg.model, cfg.workload)
    assert model_counts.param_count(cfg.model, cfg.workload) == json.loads(json.dumps(runs))
    assert model_counts.flops_per_token(cfg.model, 64, cfg.workload) == probes.count_flops_per_token(
        cfg.model, 64, cfg.workload)
    written = sorted(tmp_path.glob("*.json"))
    assert len(written) == 2
    for fn in (model_counts._param_count, model_counts._flops_per_token):
        fn.cache_clear()
    monkeypatch.setattr(probes, "count_flops_per_token", lambda *a: pytest.fail("counted again"))
    monkeypatch.setattr(models, "param_count", lambda *a: pytest.fail("built again"))
    assert model_counts.param_count(cfg.model, cfg.workload) == json.loads(json.dumps(runs))
    assert model_counts.flops_per_token(cfg.model, 64, cfg.workload) > 0
