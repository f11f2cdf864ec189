"""What makes a plan fast must not change it: the advisor's candidates read a plain copy of their config
(config/frozen.py), the peak's sums over blocks are running sums, the planners' model counts come from the
disk (runtime/model_counts.py), counted once by whichever process starts first, and the op counter flattens
each op's arguments itself. Each is held here to the slow way's answer, exactly."""
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


def test_the_op_counters_own_flattening_finds_what_pytree_finds():
    """The op counter walks every op's arguments with its own flattening (runtime/measure/work_count.tensors_in,
    _localized), not pytree's: the same tensors, in pytree's order, and the same local shards in the same places."""
    import collections

    import torch
    import torch.utils._pytree as pytree

    from harness.runtime.measure import work_count

    class DTensor(torch.Tensor):  # what the counter takes a DTensor by: its type's name and its local shard
        pass

    shard = torch.zeros(1)
    dt = torch.ones(2).as_subclass(DTensor)
    dt._local_tensor = shard
    pair = collections.namedtuple("pair", "a b")
    a, b = torch.ones(3), torch.ones(4, dtype=torch.int64)
    trees = [((a, [b, None, 2.0], {"x": dt, "y": (a,)}), {"out": [b, a]}),
             ((pair(a, dt), torch.Size([2, 3]), collections.OrderedDict(z=b, w=dt)), {}),
             ((), {}), (dt, {"alpha": 1})]
    for tree in trees:
        theirs = [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]
        ours = work_count.tensors_in(tree, [])
        assert [id(t) for t in ours] == [id(t) for t in theirs]
        mapped, own = pytree.tree_map(work_count._local, tree), work_count._localized(tree)
        assert pytree.tree_structure(own) == pytree.tree_structure(mapped)
        assert [id(t) for t in pytree.tree_leaves(own)] == [id(t) for t in pytree.tree_leaves(mapped)]
    assert any(t is shard for t in pytree.tree_leaves(work_count._localized(trees[0])))  # the DTensor's shard


def test_a_trace_another_process_is_tracing_is_waited_for_and_a_dead_ones_mark_passed_over(tmp_path, monkeypatch):
    """runtime/compiled/trace_cache.on_disk: the advisor's replays' process counts the model while the search
    composes its candidates; the search, asking for the counts meanwhile, reads what that process writes rather
    than counting them too. A mark whose process ended without writing does not hold anyone up."""
    import subprocess
    import sys
    import threading

    from harness.runtime.compiled import trace_cache

    monkeypatch.setattr(trace_cache, "traces_dir", lambda: tmp_path)
    calls = []

    @trace_cache.on_disk(__file__)
    def traced(n):
        calls.append(n)
        return {"n": n, "by": "this process"}

    paths = {}
    for n in (1, 2):  # where each is kept: traced once, then removed, so that the cache is empty again
        traced(n)
        (paths[n],) = set(tmp_path.glob("*.json")) - set(paths.values())
    assert calls == [1, 2] and not list(tmp_path.glob("*.tracing"))
    for path in paths.values():
        path.unlink()
    traced.cache_clear()
    calls.clear()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # another process "tracing" 1: its mark, and its result written a moment later
        paths[1].with_suffix(".tracing").write_text(str(other.pid))

        def finish():
            paths[1].write_text(json.dumps({"n": 1, "by": "the other process"}))
            paths[1].with_suffix(".tracing").unlink()
        threading.Timer(0.3, finish).start()
        assert traced(1) == {"n": 1, "by": "the other process"} and calls == []
    finally:
        other.kill()
        other.wait()
    # a mark left by a process that has ended: traced here, at once
    paths[2].with_suffix(".tracing").write_text(str(other.pid))
    assert traced(2) == {"n": 2, "by": "this process"} and calls == [2]
    assert not list(tmp_path.glob("*.tracing"))


def test_the_replay_processes_of_a_batch_take_each_config_once_in_its_order(tmp_path):
    """runtime/simulate/replay.taken: the processes of a batch share it as they go (launcher/replays.py): every
    config taken by exactly one, the costliest first as the batch's order says."""
    from harness.runtime.simulate.replay import taken

    names = [f"c{i}" for i in range(7)]
    for name in names:
        (tmp_path / f"{name}.yaml").write_text("{}")
    order = names[::-1]
    (tmp_path / "order.txt").write_text("\n".join(order))
    first, second = taken(tmp_path), taken(tmp_path)
    took = {"first": [], "second": []}
    for turn in ["first", "second", "second", "first", "first", "second", "first", "second", "first"]:
        path = next(first if turn == "first" else second, None)
        if path is not None:
            took[turn].append(path.stem)
    assert sorted(took["first"] + took["second"]) == sorted(names)
    assert not set(took["first"]) & set(took["second"])
    assert [n for n in order if n in took["first"]] == took["first"]


def test_a_backend_swapped_into_a_composition_is_hydras_own_composition():
    """compose() of `backend=<name>` beside other overrides is made from their composition with the backend's
    preset in place of its `backend` node (config/compose._backend_swapped: one Hydra composition for 16
    backends, the advisor's 8 s of compositions at 70B): exactly what Hydra's public compose() gives, on the
    default config, a 70B multi-node preset, experiments and a backend's own keys set after it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from harness.config import schema
    from harness.config.compose import CONF, _backend_written_by_others, _derived

    schema.register()
    bases = [[], ["model=llama_70b", "parallelism=gpu8", "parallelism.nnodes=8", "train.precision=bf16"],
             ["experiment=tp"], ["experiment=bucket_size", "backend.bucket_elements=400000"]]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for index, backend in enumerate(backends()):  # each backend once, each base with 4 (a composition: 0.5 s)
            base = bases[index % len(bases)]
            overrides = [*base[:1], f"backend={backend}", *base[1:]]
            theirs = _derived(hydra_compose(config_name="config", overrides=overrides), overrides)
            assert OmegaConf.to_container(compose(overrides), resolve=True) == OmegaConf.to_container(
                theirs, resolve=True), (base, backend)
    assert not _backend_written_by_others(("experiment=tp",))  # the swap was taken, not Hydra's own
