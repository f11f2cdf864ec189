"""Checkpoints (runtime/train_state.py): every backend saves its whole training state with its framework's own
API and resumes it to the same losses; DCP's checkpoints resume at another world size; what a save and a load
cost is measured, with theory's bytes beside them; every checkpoint exports to a Hugging Face directory. The fp32
sweep (conftest.py: 3 ranks, grad_accum 2) saves after step 3, `resumed_runs` trains its steps 3 and 4 again
from there, and `reshard_runs` does so at 2 ranks. The kill in the middle of a save, and DCP's asynchronous save,
are a drill (tests/test_checkpoint_drill.py)."""
from __future__ import annotations

import json

import pytest

from conftest import BACKENDS, FINETUNE, SAVED_AT, saved
from harness.config import families, rules
from harness.config.compose import compose
from harness.core.checkpoint_dirs import MARKER, latest, step_dir

pytestmark = pytest.mark.slow


def losses(records) -> list:
    return [r["loss/loss"] for r in records]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_run_reaches_the_uninterrupted_runs_losses(fp32_runs, resumed_runs, backend):
    summary, records, _ = resumed_runs[backend]
    assert summary["status"] == "ok", summary.get("reason")
    whole = fp32_runs[backend][1]
    assert [r["step"] for r in records] == [r["step"] for r in whole][SAVED_AT:]
    # the data position is the step, and the RNG, model and optimizer come back whole. Bit for bit is what
    # resuming gives where the reduction order is the same too; DDP rebuilds its gradient buckets after its first
    # step, which is another step of a resumed run, and the grad norm then moves in its 8th digit: 1e-6 at worst
    assert losses(records) == pytest.approx(losses(whole)[SAVED_AT:], rel=1e-6, abs=0)
    assert [r["loss/grad_norm"] for r in records] == pytest.approx(
        [r["loss/grad_norm"] for r in whole][SAVED_AT:], rel=1e-6, abs=0)
    figures = summary["figures"]
    assert figures["checkpoint/resumed_from_step"] == SAVED_AT and figures["checkpoint/load_s"] > 0
    assert any("resumed from step 3" in n for n in summary["notes"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_from_3_ranks_resumes_at_2_to_the_same_losses(fp32_runs, reshard_runs, backend):
    summary, records, run_dir = reshard_runs[backend]
    assert summary["status"] == "ok", summary.get("reason")
    assert summary["figures"]["checkpoint/resumed_from_world"] == 3
    # the same 6 sequences a step, reduced in another order over 2 ranks x 3 micro-batches
    assert losses(records) == pytest.approx(losses(fp32_runs[backend][1])[SAVED_AT:], rel=1e-4)
    # DCP reshards on load; DeepSpeed loads what its own ds_to_universal made of its ZeRO files
    report = json.loads((run_dir / "ranks" / "report.json").read_text())
    how = report["ranks"][0]["checkpoint"]["resumed"]["framework"]
    deepspeed = families.of(compose([f"backend={backend}"]).backend).checkpoint_format == "DeepSpeed"
    assert how.get("load_universal", False) == deepspeed, how


def test_fsdp2_resumes_an_fsdp1_checkpoint_to_fsdp1s_losses(fp32_runs, migrate_runs):
    # the migration path: FSDP1's sharded state dict (ShardedTensors of flat slices, through torch's distributed
    # state dict) saved by DCP at 3 ranks, loaded by FSDP2 (DTensors) at 2, resharded by DCP on load
    summary, records, _ = migrate_runs["fsdp"]
    assert summary["status"] == "ok", summary.get("reason")
    assert summary["figures"]["checkpoint/resumed_from_world"] == 3
    assert losses(records) == pytest.approx(losses(fp32_runs["fsdp1"][1])[SAVED_AT:], rel=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_save_is_timed_and_its_bytes_stand_beside_theory(fp32_runs, backend):
    summary, _, run_dir = fp32_runs[backend]
    f = summary["figures"]
    assert f["checkpoint/saves"] == 1 and (run_dir / "checkpoints" / f"step_{SAVED_AT:07d}" / MARKER).is_file()
    assert 0 < f["checkpoint/save_blocking_s"] <= f["checkpoint/save_total_s"]
    # every tensor byte theory names is on disk; the rest is the formats' headers and metadata, a few KB a tensor
    # (~20% of a 125k-parameter model's 1.5 MB under DCP, nothing on a real model: make checkpoint's small_llama)
    assert 1.0 <= f["checkpoint/bytes_on_disk"] / f["checkpoint/bytes_on_disk_predicted"] < 1.3
    assert 1.0 <= f["checkpoint/rank_bytes_max"] / f["checkpoint/rank_bytes_predicted"] < 1.3
    report = json.loads((run_dir / "ranks" / "report.json").read_text())
    by_rank = [sum(b for b in s["bytes_by_rank"]) for r in report["ranks"] for s in r["checkpoint"]["saves"]
               if "bytes_by_rank" in s]
    assert by_rank and by_rank[0] <= f["checkpoint/bytes_on_disk"]  # each rank's own files, within the whole


def test_a_checkpoint_of_another_format_stage_or_precision_is_refused_in_one_line(fp32_runs):
    other_stage = compose(["backend=ds_zero3", *FINETUNE, saved(fp32_runs, "ds_zero2")])
    found = rules.problems(other_stage)
    assert len(found) == 1 and "ZeRO stage 2" in found[0] and "ZeRO stage 3" in found[0], found
    other_precision = compose(["backend=ds_zero2", *FINETUNE, "train.precision=bf16", saved(fp32_runs, "ds_zero2")])
    assert any("fp32" in p and "bf16" in p for p in rules.problems(other_precision))
    dcp_into_deepspeed = compose(["backend=ds_zero1", *FINETUNE, saved(fp32_runs, "fsdp")])
    assert any("a DCP checkpoint of fsdp" in p for p in rules.problems(dcp_into_deepspeed))
    # DDP and FSDP2 read each other's: one format, resharded on load
    assert not rules.problems(compose(["backend=fsdp", *FINETUNE, saved(fp32_runs, "ddp")]))


def test_a_save_without_its_marker_is_never_resumed(tmp_path):
    for step in (2, 4):
        step_dir(tmp_path, step).mkdir(parents=True)
    (step_dir(tmp_path, 2) / MARKER).write_text("{}")
    assert latest(tmp_path) == step_dir(tmp_path, 2)  # step 4's save never finished
    cfg = compose(["backend=ddp", f"train.resume={step_dir(tmp_path, 4)}"])
    found = rules.problems(cfg)
    assert len(found) == 1 and "no complete checkpoint" in found[0], found
    assert any("train.checkpoint_async=true" in p for p in rules.problems(
        compose(["backend=ds_zero2", "train.checkpoint_every=2", "train.checkpoint_async=true"])))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_checkpoint_exports_to_a_hugging_face_directory_with_its_trained_weights_exactly(fp32_runs, backend,
                                                                                                 tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from harness.runtime import initial_weights, models
    from harness.runtime.pretrained import Checkpoint
    from harness.studies.checkpoints.export import export, weights

    directory = step_dir(fp32_runs[backend][2] / "checkpoints", SAVED_AT)
    out = export(directory, tmp_path / "hf")  # DCP's dcp_to_torch_save, or DeepSpeed's zero_to_fp32
    trained = weights(directory)
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert trained and all(torch.equal(loaded[k], v) for k, v in trained.items())
    # and as the harness's own model.pretrained_path, read tensor by tensor as every rank reads one
    model = models.build(compose(["model=tiny_llama"]).model)
    initial_weights.apply(model, seed=1, checkpoint=Checkpoint(out))
    assert all(torch.equal(p, trained[k]) for k, p in model.state_dict().items() if k in trained)
    # the same three steps trained every backend to the same weights (fp32 loss parity, reduction order apart)
    reference = weights(step_dir(fp32_runs["ddp"][2] / "checkpoints", SAVED_AT))
    assert all(torch.allclose(trained[k], reference[k], rtol=1e-4, atol=1e-6) for k in reference)


def test_loss_agreement_holds_each_fsdp1_run_to_its_fsdp2_twin(fp32_runs):
    # `shardbench loss-agreement` over the fp32 sweep (3 ranks, grad_accum 2): FSDP1 against FSDP2, full shard and
    # grad-op, the same losses step for step, none diverging; its table written beside the sweep
    from harness.studies.axes import loss_agreement

    sweep = fp32_runs["fsdp1"][2].parent
    assert loss_agreement.main(["--sweep", str(sweep), "--axis", "backend",
                                "--pairs", "fsdp1:fsdp,fsdp1_grad_op:fsdp_grad_op"]) == 0
    rows = {r["run"]: r for r in json.loads((sweep / "agreement.json").read_text())}
    for mine, twin in (("fsdp1", "fsdp"), ("fsdp1_grad_op", "fsdp_grad_op")):
        r = rows[f"backend={mine}"]
        assert r["reference"] == f"backend={twin}" and r["diverges_at"] is None, r
        assert 0 <= r["max_rel_diff"] <= 1e-4, r
    assert rows["backend=ddp"]["reference"] is None  # not paired: no comparison invented
    assert "| backend=fsdp1 | backend=fsdp |" in (sweep / "agreement.md").read_text()


def test_checkpoint_keep_deletes_only_older_complete_saves_and_stale_partial_ones(tmp_path):
    """train.checkpoint_keep=N (core/checkpoint_dirs.prune, called once a newer save's marker is written): the
    newest N complete checkpoints stay; older complete ones and unfinished saves older than the oldest kept go;
    an unfinished save newer than it (one being written) stays; 0 keeps every one."""
    from harness.core.checkpoint_dirs import MARKER, latest, prune, step_dir

    def save(step, complete=True):
        step_dir(tmp_path, step).mkdir(parents=True)
        (step_dir(tmp_path, step) / "model.bin").write_bytes(b"x" * 10)
        if complete:
            (step_dir(tmp_path, step) / MARKER).write_text("{}")

    for step in (2, 4, 6, 8):
        save(step)
    save(3, complete=False)
    save(10, complete=False)
    assert prune(tmp_path, 0) == [] and len(list(tmp_path.iterdir())) == 6
    deleted = prune(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["step_0000002", "step_0000003", "step_0000004"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000006", "step_0000008", "step_0000010"]
    assert latest(tmp_path) == step_dir(tmp_path, 8)
