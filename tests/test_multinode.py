"""Multi-node runs emulated on this machine: one launcher per "node", each with its SHARDBENCH_NODE_RANK, all
rendezvousing at 127.0.0.1 over gloo, sharing one run dir as nodes share a filesystem (launcher/nodes.py)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, cli_command, extensions_dir
from harness.config.compose import hybrid_backends

pytestmark = pytest.mark.slow
FAST = ["logger=none", "train.steps=5", "train.warmup_steps=2", "profile=parity", "train.measure_flops=false",
        "train.breakdown_steps=0", "train.profile_memory=false"]


def start_node(node: int, run_dir: Path, port: int, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": extensions_dir(), "SHARDBENCH_NODE_RANK": str(node),
           "SHARDBENCH_MASTER_ADDR": "127.0.0.1"}
    return subprocess.Popen([*cli_command(), "parallelism.nnodes=2", f"dist.master_port={port}",
                             f"paths.root={run_dir.parent}", f"hydra.run.dir={run_dir}", *overrides],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def two_nodes(run_dir: Path, port: int, *args: str) -> tuple:
    """One run as 2 emulated nodes: node 1 started first, so it waits for node 0 to own the run dir before its
    torchrun joins; both must end ok. Returns each node's stdout."""
    follower = start_node(1, run_dir, port, *args)
    time.sleep(1)
    owner = start_node(0, run_dir, port, *args)
    out0, err0 = owner.communicate(timeout=300)
    out1, err1 = follower.communicate(timeout=60)
    assert owner.returncode == 0 and follower.returncode == 0, err0[-2000:] + err1[-2000:]
    return out0, out1


def losses(run_dir: Path) -> list:
    return [json.loads(line)["loss/loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# Two launchers forming one run is launcher behaviour: every cell is a drill (make test-drills, which CI runs),
# ZeRO-3's too (46 s), to keep make test a short loop
DRILL = pytest.mark.drill
BACKENDS = ("ds_zero3", "ddp", "fsdp")
HYBRID = tuple(hybrid_backends())  # HSDP, partial resharding, ZeRO++: a node's ranks are their group; against DDP


def released(backend: str) -> list:
    """ZeRO++'s hpZ acts on what ZeRO-3 releases after forward. tiny_llama is far below DeepSpeed's 1e9-element
    reuse distance, so by default nothing is released before the step and backward gathers nothing: a hybrid
    backend's cell releases as make hybrid's "released" rows do (the family's forward_release_overrides; none
    for FSDP2), so that backward gathers in the node. The flat backends run at their defaults."""
    from harness.studies.predict.hybrid import release

    return release(backend) if backend in HYBRID else []


def one_node(root: Path, ranks: int, backends=BACKENDS, *extra: str) -> dict:
    """Each backend's one-node reference at `ranks` ranks, as the cells of one launch (launcher/cells.py: each
    a whole run in its own run dir, through a run's own code): backend -> its run dir."""
    from harness.launcher.cells import run_cells

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    summaries = run_cells(root / f"one{ranks}", [(b, [f"backend={b}"]) for b in backends],
                          [*FAST, f"parallelism.nproc_per_node={ranks}", f"paths.root={root}", *extra], report=False)
    assert all(s["status"] == "ok" for s in summaries.values()), summaries
    return {b: root / f"one{ranks}" / b for b in backends}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> dict:
    return one_node(tmp_path_factory.mktemp("reference"), 4)


# one rank a node, a local world of one: DeepSpeed (its shm comm op among ranks of one node) and DDP. FSDP2 adds no
# launcher path here that two ranks a node (above, every backend) does not take
ONE_A_NODE = ("ds_zero3", "ddp")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    return one_node(tmp_path_factory.mktemp("reference"), 2, ONE_A_NODE)


@pytest.mark.parametrize("backend", [pytest.param(b, marks=DRILL) for b in BACKENDS + HYBRID])
def test_two_nodes_of_two_ranks_train_as_one_node_of_four_and_node_0_owns_the_run_dir(tmp_path, backend, four_ranks):
    args = (f"backend={backend}", "parallelism.nproc_per_node=2", *FAST, *released(backend))
    out0, out1 = two_nodes(tmp_path / "two", 29641 + (BACKENDS + HYBRID).index(backend) * 3, *args)
    two, one = losses(tmp_path / "two"), losses(four_ranks[backend if backend in BACKENDS else "ddp"])
    print(f"PARITY 2x2 {backend}: largest relative loss difference against 1x4 "
          f"{max(abs(a - b) / abs(b) for a, b in zip(two, one)):.2e} over {len(one)} steps")
    assert two == pytest.approx(one, rel=1e-4)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["world_size"] == 4 and len(summary["per_rank"]) == 4
    # the counted step's bytes, by the link their group crosses, against theory/communication.py: a flat
    # backend's groups all cross the two nodes; HSDP's shard groups and partial resharding's backward gathers
    # and ZeRO++'s backward gathers from its secondary shard stay inside a node
    f = summary["figures"]
    print(f"LINKS 2x2 {backend}: " + ", ".join(f"{link} {f[f'comm/measured_{link}_node_bytes_per_step']:,.0f} B "
                                              f"(predicted {f[f'comm/predicted_{link}_node_bytes_per_step']:,.0f})"
                                              for link in ("intra", "inter")))
    for link in ("intra", "inter"):
        measured, predicted = (f[f"comm/{kind}_{link}_node_bytes_per_step"] for kind in ("measured", "predicted"))
        assert measured == pytest.approx(predicted, rel=0.01), (link, measured, predicted)
    assert (f["comm/measured_intra_node_bytes_per_step"] > 0) == (backend in HYBRID)
    assert abs(f["memory/model_states_error_pct"]) <= 5, f["memory/model_states_error_pct"]
    # node 0 printed the run's line; node 1 only its own node's, and wrote only node-scoped files
    assert f"[ok] {backend}" in out0 and "[ok]" not in out1 and "[node 1] ranks 2-3 ok" in out1
    assert (tmp_path / "two" / "launcher.node1.log").stat().st_size > 0
    assert not (tmp_path / "two" / "attempts").exists()  # nothing of node 0's was taken for an earlier attempt
    assert sorted(p.name for p in (tmp_path / "two" / "ranks").glob("rank*.json")) == [f"rank{r}.json" for r in range(4)]


@DRILL
@pytest.mark.parametrize("backend", ONE_A_NODE)
def test_two_nodes_of_one_rank_train_as_one_node_of_two(tmp_path, backend, two_ranks):
    args = (f"backend={backend}", "parallelism.nproc_per_node=1", *FAST)
    port = 29671 + BACKENDS.index(backend)
    launchers = [start_node(n, tmp_path / "two", port, *args) for n in (0, 1)]
    errors = [launcher.communicate(timeout=300)[1] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    assert losses(tmp_path / "two") == pytest.approx(losses(two_ranks[backend]), rel=1e-4)


def test_another_launch_is_refused_while_a_node_of_the_run_holds_the_dir(tmp_path):
    from harness.core.runlock import RunLock

    run_dir = tmp_path / "held"
    with RunLock(run_dir, info={"rdzv_id": "another-run", "node": 0}):
        env = {**os.environ, "SHARDBENCH_NODE_RANK": "1", "SHARDBENCH_RDZV_ID": "this-run"}
        proc = subprocess.run([*cli_command(), "parallelism.nnodes=2", *FAST, f"paths.root={tmp_path}",
                               f"hydra.run.dir={run_dir}", "dist.rendezvous_timeout_s=30"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "rendezvous id another-run, not this-run" in proc.stderr, proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", ".lock.node1"]  # nothing written


@pytest.mark.drill
def test_a_killed_node_fails_the_run_naming_it_and_a_missing_node_times_out(tmp_path):
    args = ("parallelism.nproc_per_node=1", "train.steps=400", "logger=none", "train.warmup_steps=2",
            "train.measure_flops=false")
    owner, follower = (start_node(n, tmp_path / "kill", 29642, *args) for n in (0, 1))
    try:
        killed_node_fails_the_run(tmp_path, owner, follower)
    finally:  # a failed assertion must not leave two launchers training for 400 steps
        for launcher in (owner, follower):
            launcher.kill()
    # node 1 never starts: node 0 gives up after the rendezvous timeout, naming it
    started = time.time()
    alone = start_node(0, tmp_path / "alone", 29643, *args, "dist.rendezvous_timeout_s=10")
    alone.communicate(timeout=120)
    summary = json.loads((tmp_path / "alone" / "summary.json").read_text())
    assert summary["status"] == "timeout" and summary["reason"].startswith("node 1 never joined the rendezvous")
    assert alone.returncode == 1 and time.time() - started < 60


def killed_node_fails_the_run(tmp_path, owner, follower) -> None:
    metrics = tmp_path / "kill" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.2)
    # every process of the run (both torchrun agents, their ranks and whatever the ranks started); node 1's rank
    # is the one its agent started (a rank's own helpers inherit GROUP_RANK too)
    everything = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "kill") in " ".join(p.info["cmdline"] or [])]
    node1 = [p for p in everything if p.environ().get("GROUP_RANK") == "1"
             and "torch.distributed.run" in " ".join(p.parent().cmdline())]
    assert len(node1) == 1, [(p.pid, p.environ().get("GROUP_RANK"), p.environ().get("RANK")) for p in everything]
    node1[0].kill()
    out0, _ = owner.communicate(timeout=120)
    out1, _ = follower.communicate(timeout=60)
    summary = json.loads((tmp_path / "kill" / "summary.json").read_text())
    print(f"KILLED NODE: {summary['status']}: {summary['reason']}")
    assert summary["status"] != "ok" and summary["reason"].startswith("rank 1 (node 1) killed"), summary["reason"]
    assert owner.returncode == 1 and follower.returncode == 1 and "[node 1] ranks 1-1: rank 1 killed" in out1
    assert not [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # nothing left


@DRILL
def test_tensor_parallelism_inside_each_of_two_nodes_trains_as_ddp_and_keeps_its_bytes_in_the_node(tmp_path):
    # 2 emulated nodes x 2 ranks as dp 2 x tp 2: each node's two ranks are a tensor-parallel group (consecutive
    # ranks), the data-parallel groups cross the nodes; the same 4 sequences a step as DDP at 4 ranks (micro-batch
    # 2 on 2 data-parallel ranks against 1 on 4)
    two_nodes(tmp_path / "two", 29691, "backend=fsdp", "parallelism.nproc_per_node=2", "parallelism.tp=2", *FAST)
    one = one_node(tmp_path / "ref", 4, ("ddp",), "parallelism.micro_batch=1")
    assert losses(tmp_path / "two") == pytest.approx(losses(one["ddp"]), rel=1e-4)
    f = json.loads((tmp_path / "two" / "summary.json").read_text())["figures"]
    for link in ("intra", "inter"):
        measured, predicted = (f[f"comm/{kind}_{link}_node_bytes_per_step"] for kind in ("measured", "predicted"))
        assert measured == pytest.approx(predicted, rel=0.01), (link, measured, predicted)
    # tensor parallelism's collectives stay inside each node; FSDP2's over the data-parallel ranks cross them
    assert f["comm/measured_intra_node_bytes_per_step"] > 0 and f["comm/measured_inter_node_bytes_per_step"] > 0


@DRILL
@pytest.mark.parametrize("backend, port", [("fsdp", 29693), ("ds_zero2", 29695), ("fsdp_hsdp", 29697)])
def test_context_parallelism_inside_each_of_two_nodes_trains_as_ddp_and_keeps_its_bytes_in_the_node(tmp_path,
                                                                                                  backend, port):
    # 2 emulated nodes x 2 ranks as dp 2 x cp 2 (issue 71's cell): each node's two ranks are a context-parallel
    # group (consecutive ranks) running torch's ring under FSDP2 or Ulysses under ZeRO-2, the data-parallel groups
    # cross the nodes; the same 4 sequences a step as DDP at 4 ranks (micro-batch 2 on 2 data-parallel ranks).
    # Under HSDP (fsdp_hsdp) the node's cp ranks are also its shard group (dp_shard 1 x cp 2, torchtitan's
    # dp_shard_cp), and the nodes are its replicas: only the all-reduce of each gradient shard crosses them
    two_nodes(tmp_path / "two", port, f"backend={backend}", "parallelism.nproc_per_node=2", "parallelism.cp=2",
              *FAST)
    one = one_node(tmp_path / "ref", 4, ("ddp",), "parallelism.micro_batch=1")
    assert losses(tmp_path / "two") == pytest.approx(losses(one["ddp"]), rel=1e-4)
    f = json.loads((tmp_path / "two" / "summary.json").read_text())["figures"]
    gap = max(abs(a - b) / b for a, b in zip(losses(tmp_path / "two"), losses(one["ddp"])))
    print(f"CP ON 2 NODES {backend}: losses {gap:.1e} from DDP's; bytes a step intra "
          f"{f['comm/measured_intra_node_bytes_per_step']:,.0f} ({f['comm/predicted_intra_node_bytes_per_step']:,.0f}),"
          f" inter {f['comm/measured_inter_node_bytes_per_step']:,.0f} "
          f"({f['comm/predicted_inter_node_bytes_per_step']:,.0f})")
    for link in ("intra", "inter"):
        measured, predicted = (f[f"comm/{kind}_{link}_node_bytes_per_step"] for kind in ("measured", "predicted"))
        assert measured == pytest.approx(predicted, rel=0.01), (backend, link, measured, predicted)
    # the ring's rotations (Ulysses' all-to-alls) stay inside each node; the gradients' reduction crosses them
    assert f["comm/measured_intra_node_bytes_per_step"] > 0 and f["comm/measured_inter_node_bytes_per_step"] > 0
    assert abs(f["memory/model_states_error_pct"]) <= 1, (backend, f["memory/model_states_error_pct"])


@pytest.mark.drill
def test_a_lost_node_is_named_with_its_step_and_a_relaunch_resumes_with_the_same_losses(tmp_path):
    """Node 1's launcher SIGKILLed mid-run (its torchrun and rank go with it): node 0 ends well within
    dist.timeout_s, its row names the lost node and the steps done, and every step's metrics are kept; both nodes
    launched again with train.resume=auto go on from the last complete checkpoint with the same losses."""
    from harness.core.checkpoint_dirs import MARKER, latest, step_dir, step_of

    run_dir = tmp_path / "lost"
    args = ("parallelism.nproc_per_node=1", "logger=none", "train.warmup_steps=2", "train.measure_flops=false",
            "train.checkpoint_every=5", "dist.timeout_s=30")
    follower = start_node(1, run_dir, 29662, *args, "train.steps=400")
    time.sleep(1)
    owner = start_node(0, run_dir, 29662, *args, "train.steps=400")
    try:
        deadline = time.time() + 180
        metrics = run_dir / "metrics.jsonl"
        while time.time() < deadline and not ((step_dir(run_dir / "checkpoints", 10) / MARKER).exists()
                                              and len(metrics.read_text().splitlines()) >= 13):
            time.sleep(0.1)
        lost_at = time.time()
        follower.kill()  # the whole node: its launcher, whose torchrun and rank die with it
        owner.communicate(timeout=120)
        assert time.time() - lost_at < 30 + 15  # within dist.timeout_s and a margin
    finally:
        for launcher in (owner, follower):
            launcher.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"].startswith("node 1 lost after "), summary["reason"]
    done = int(summary["reason"].split("lost after ")[1].split(" steps")[0])
    first = losses(run_dir)
    assert len(first) == done == summary["figures"]["train/steps_completed"]  # every step's metrics kept
    newest = latest(run_dir / "checkpoints")
    if step_of(newest) == done:  # lost right after a save (CI saw it): no step would be run twice to compare.
        (newest / MARKER).unlink()  # As if lost during that save: auto must pass over the unfinished one
    resumed_from = step_of(latest(run_dir / "checkpoints"))
    assert 10 <= resumed_from < done
    two_nodes(run_dir, 29663, *args, "train.resume=auto", f"train.steps={done + 2}")
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["status"] == "ok" and again["figures"]["checkpoint/resumed_from_step"] == resumed_from
    redone = losses(run_dir)  # the steps from the checkpoint on, which the lost attempt ran too up to `done`
    overlap = min(len(redone), done - resumed_from)
    assert overlap >= 1 and redone[:overlap] == pytest.approx(first[resumed_from:resumed_from + overlap], abs=1e-6)


@DRILL
def test_expert_parallelism_under_hsdp_keeps_the_experts_in_each_node_and_trains_as_ddp(tmp_path):
    # 2 emulated nodes x 2 ranks, HSDP (a node's ranks its shard group, the nodes its replicas) at ep 2: each
    # node's two ranks split the experts (ep 2 x efsdp 1), the dispatch and combine stay inside the node, and only
    # the replicas' all-reduce of each gradient shard crosses the nodes; the same 8 sequences a step as DDP's
    moe = ("model=tiny_qwen3_moe", "parallelism.micro_batch=1", "parallelism.grad_accum=2")
    two_nodes(tmp_path / "two", 29699, "backend=fsdp_hsdp", "parallelism.nproc_per_node=2", "parallelism.ep=2",
              *moe, *FAST)
    one = one_node(tmp_path / "ref", 4, ("ddp",), *moe)
    assert losses(tmp_path / "two") == pytest.approx(losses(one["ddp"]), rel=1e-4)
    f = json.loads((tmp_path / "two" / "summary.json").read_text())["figures"]
    print(f"EP UNDER HSDP ON 2 NODES: bytes a step intra {f['comm/measured_intra_node_bytes_per_step']:,.0f} "
          f"({f['comm/predicted_intra_node_bytes_per_step']:,.0f}), inter "
          f"{f['comm/measured_inter_node_bytes_per_step']:,.0f} ({f['comm/predicted_inter_node_bytes_per_step']:,.0f})")
    # across the nodes only the replicas' all-reduces, which the routing does not size; inside them the all-to-alls
    # follow what the router sent (the theory's balanced rows: tests/test_expert_parallel.py holds them per rank)
    inter = (f["comm/measured_inter_node_bytes_per_step"], f["comm/predicted_inter_node_bytes_per_step"])
    assert inter[0] == pytest.approx(inter[1], rel=0.01), inter
    assert abs(f["memory/model_states_error_pct"]) <= 1, f["memory/model_states_error_pct"]
