"""Hybrid sharding's theory, in this process: FSDP2 HSDP (a replicate x shard mesh), partial resharding
(reshard_after_forward=<ranks per node>) and DeepSpeed ZeRO++ (hpZ, qwZ, qgZ) against flat full sharding and
ZeRO-3, on llama_7b at 4 nodes x 8 GPUs; which
link each collective's bytes cross; and the rules that refuse a group that does not fit. The real runs (losses
against DDP, model states, bytes counted per process group on 2 emulated nodes x 2 ranks) are the drills in
tests/test_multinode.py."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config import rules
from harness.config.compose import compose, flat_backends, hybrid_backends
from harness.config.mesh import Mesh
from harness.core.paths import CONF
from harness.runtime import models
from harness.theory.communication import counted_by_link
from harness.theory.predict import predict

SHAPE = ["model=llama_7b", "parallelism=gpu8", "parallelism.nnodes=4", "train.precision=bf16"]


@pytest.fixture(scope="module")
def llama_7b():
    counts = models.param_count(compose(SHAPE).model)
    return counts, {b: predict(compose([*SHAPE, f"backend={b}"]), 32, counts)
                    for b in ("fsdp", "ds_zero3", *hybrid_backends())}


def test_hsdp_shards_inside_the_node_and_sends_only_the_gradient_shard_across_nodes(llama_7b):
    counts, p = llama_7b
    psi = counts["total"]
    flat, hsdp = p["fsdp"], p["fsdp_hsdp"]
    # states are sharded 8 ways, not 32: four times full sharding's 16 bytes a parameter / N (padding aside)
    assert hsdp["memory/model_states_predicted_bytes"] == pytest.approx(16 * psi / 8, rel=0.01)
    assert flat["memory/model_states_predicted_bytes"] == pytest.approx(16 * psi / 32, rel=0.01)
    # and the paper's formula (16 B a parameter in mixed precision, stage 3) over the ranks it shards over
    assert hsdp["memory/model_states_paper_bytes"] == pytest.approx(16 * psi / 8)
    # full sharding's gathers and reduce-scatters all cross nodes; HSDP's cross only as the all-reduce of each
    # rank's fp32 gradient shard among the 4 replicas: 2 x 3/4 x 4 B x psi / 8
    assert flat["comm/predicted_intra_node_bytes_per_step"] == 0
    assert hsdp["comm/predicted_inter_node_bytes_per_step"] == pytest.approx(2 * 3 / 4 * 4 * psi / 8, rel=0.01)
    assert hsdp["comm/predicted_inter_node_bytes_per_step"] < flat["comm/predicted_inter_node_bytes_per_step"] / 9


def test_partial_resharding_gathers_backward_inside_the_node_for_a_shard_of_every_block_held(llama_7b):
    counts, p = llama_7b
    flat, partial = p["fsdp"], p["fsdp_partial"]
    assert partial["memory/model_states_predicted_bytes"] == flat["memory/model_states_predicted_bytes"]
    # backward's block gathers (2 B a parameter, 7/8 of each sent) move inside the node
    blocks = 32 * counts["per_block"]
    assert partial["comm/predicted_intra_node_bytes_per_step"] == pytest.approx(2 * blocks * 7 / 8, rel=0.01)
    # the cost: at the start of backward every block keeps 1/8 of its parameters in bf16
    held = partial["memory/backward_start_post_forward_shards_predicted_bytes"]
    assert held == pytest.approx(2 * blocks / 8, rel=1e-6)
    assert partial["memory/tensor_peak_predicted_bytes"] > flat["memory/tensor_peak_predicted_bytes"]


def test_zeropp_hpz_moves_backward_gathers_inside_the_node_for_a_secondary_shard(llama_7b):
    counts, p = llama_7b
    zero3, hpz = p["ds_zero3"], p["ds_zeropp"]
    assert hpz["memory/model_states_predicted_bytes"] == zero3["memory/model_states_predicted_bytes"]
    # llama_7b is above DeepSpeed's 1e9 reuse distance: what forward releases is gathered again in backward,
    # over all 32 ranks under ZeRO-3 and from the secondary shard over the node's 8 under hpZ
    assert zero3["comm/predicted_intra_node_bytes_per_step"] == 0
    moved = hpz["comm/predicted_intra_node_bytes_per_step"]
    assert moved > 0.5 * 2 * counts["total"] * 7 / 8  # most of the model: the early blocks
    regather_world = moved * (31 / 32) / (7 / 8)  # the same gather's bytes over 32 ranks
    assert hpz["comm/predicted_inter_node_bytes_per_step"] == pytest.approx(
        zero3["comm/predicted_inter_node_bytes_per_step"] - regather_world, rel=1e-6)
    # the cost: by the step every released parameter keeps 1/8 of itself in bf16
    assert hpz["memory/step_hpz_secondary_shards_predicted_bytes"] == pytest.approx(2 * counts["total"] / 8,
                                                                                      rel=0.01)


def test_zeropp_quantised_collectives_halve_the_weights_and_send_int4_gradients():
    counts = models.param_count(compose(SHAPE).model)
    base = predict(compose([*SHAPE, "backend=ds_zeropp", "profile=native"]), 32, counts)
    quant = predict(compose([*SHAPE, "backend=ds_zeropp", "profile=native", "backend.quantized_weights=true",
                             "backend.quantized_gradients=true"]), 32, counts)
    psi = counts["total"]
    # qgZ: int4 inside the node (7/8 of psi/2 bytes), then the node's reduced eighth across the 4 nodes (3/4)
    assert quant["comm/predicted_intra_node_bytes_per_step"] - base["comm/predicted_intra_node_bytes_per_step"] \
        == pytest.approx(psi / 2 * 7 / 8, rel=1e-6)
    # across nodes: forward's bf16 gathers become int8 (1 B saved a parameter) and the bf16 reduce-scatter
    # (native: DeepSpeed reduces in the model dtype, 2 B) becomes the int4 all-to-all of psi/16 bytes
    saved = psi * 31 / 32 * (1 + 2) - psi / 16 * 3 / 4
    assert base["comm/predicted_inter_node_bytes_per_step"] - quant["comm/predicted_inter_node_bytes_per_step"] \
        == pytest.approx(saved, rel=0.01)


def test_counted_bytes_split_by_whether_the_group_spans_nodes():
    rows = [{"op": "all_gather", "size_bytes": 800, "group": 2, "ranks": [2, 3], "count": 3},  # node 1 only
            {"op": "all_reduce", "size_bytes": 400, "group": 2, "ranks": [1, 3], "count": 1},  # nodes 0 and 1
            {"op": "all_reduce", "size_bytes": 4, "group": 1, "ranks": [0], "count": 5}]  # sends nothing
    assert counted_by_link(rows, Mesh(per_node=2, nodes=2)) == {"intra_node": 3 * 800 / 2, "inter_node": 400.0}


@pytest.mark.parametrize("overrides, says", [
    (["backend=fsdp_hsdp", "backend.shard_degree=3"], "backend.shard_degree=3: HSDP shards over groups that divide"),
    (["backend=fsdp_partial", "backend.reshard_after_forward=false"], "backend.partial_reshard=true: needs"),
    (["backend=fsdp_partial", "parallelism.nproc_per_node=4", "backend.reshard_degree=3"],
     "backend.reshard_degree=3: must divide the 4 ranks"),
    (["backend=fsdp_hsdp", "backend.shard_degree=-2"], "backend.shard_degree=-2: must be >= 0"),
    (["backend=ds_zero2", "backend.hpz_partition_size=2"], "backend.hpz_partition_size=2: ZeRO++ works on ZeRO-3"),
    (["backend=ds_zeropp", "parallelism.nproc_per_node=4", "backend.hpz_partition_size=3"],
     "backend.hpz_partition_size=3: hpZ groups consecutive ranks and must divide the 4"),
    (["backend=ds_zeropp", "backend.quantized_weights=true"], "backend.quantized_weights=true: ZeRO++'s qwZ runs"),
    (["backend=ds_zeropp", "backend.quantized_gradients=true"], "backend.quantized_gradients=true: ZeRO++'s qgZ"),
])
def test_a_group_that_does_not_fit_is_refused_in_one_line(overrides, says):
    found = rules.problems(compose(["parallelism=cpu2", *overrides]))
    assert any(line.startswith(says) for line in found), found


def test_the_single_node_sweeps_leave_out_exactly_the_hybrid_backends():
    # the experiments that run every backend on one node exclude the hybrid ones by name; a new hybrid backend
    # must join the list
    assert hybrid_backends() and not set(hybrid_backends()) & set(flat_backends())
    for path in sorted(Path(CONF / "experiment").glob("*.yaml")):
        params = OmegaConf.load(path).get("hydra", {}).get("sweeper", {}).get("params", {})
        spec = str(params.get("backend", ""))
        if spec.startswith("glob(*"):
            assert spec == f"glob(*,exclude=[{','.join(hybrid_backends())}])", (path.name, spec)


def test_make_hybrid_keeps_a_failed_run_as_a_row_with_its_reason():
    # a run that died is a row of the table, with its status and reason, not a crashed experiment
    from harness.studies.predict import hybrid

    failed = {"label": "fsdp_hsdp", "status": "failed", "reason": "rank 2 exited 1", "loss_vs_ddp": None,
              **{key: None for key in hybrid.FIGURES}}
    ok = {**failed, "label": "ddp", "status": "ok", "loss_vs_ddp": 0.0, "states": 2**20, "states_pred": 2**20}
    table = hybrid.render([ok, failed], [])
    assert "| fsdp_hsdp | failed: rank 2 exited 1 | - | - (-) |" in table and "| ddp | ok | 0.0e+00 | 1.00 (1.00) |" in table
