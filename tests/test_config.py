"""Configs compose, the typed schema rejects what Hydra can type-check, and the rules reject the rest."""
from __future__ import annotations

import copy
import functools
import os

import pytest
from omegaconf import OmegaConf
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from conftest import BACKENDS, REPO
from harness.config import derive, schema
from harness.config.compose import compose as compose_run
from harness.config.compose import composed_as_given
from harness.config.compose import options
from harness.config import rules as validate

schema.register()


def make(*overrides: str):
    """Hydra's composition of the overrides as given, nothing derived (composed_as_given: the same as Hydra's
    public compose(), which test_composing_a_matrix_at_once_gives_each_runs_own_config holds)."""
    return composed_as_given(list(overrides))


def no_cuda():
    return 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gpt2", "gpt2_124m", "llama_1b", "llama_7b", "llama_13b",
                                   "llama_70b"])
def test_every_backend_and_model_composes_and_validates(backend, model):
    cfg = make(f"backend={backend}", f"model={model}", "parallelism.seq_len=64")
    assert cfg.backend.name == backend and cfg.model.name == model
    assert validate.problems(cfg, no_cuda) == []


@pytest.mark.parametrize("override", ["train.stepz=3", "backend.zero_stag=2", "train.steps=three",
                                      "backend=nope", "model=gpt5"])
def test_schema_rejects_misspelt_keys_wrong_types_and_unknown_options(override):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)):
        make(override)


@pytest.mark.parametrize("overrides, key", [
    (["train.precision=fp16"], "train.precision"),
    (["train.precision=fp8"], "train.precision"),
    (["parallelism.nproc_per_node=512"], "parallelism.nproc_per_node"),
    (["parallelism=gpu1"], "parallelism.nproc_per_node"),
    (["parallelism.seq_len=4096"], "parallelism.seq_len"),
    (["train.steps=0"], "train.steps"),
    (["train.steps=-3"], "train.steps"),
    (["parallelism.micro_batch=0"], "parallelism.micro_batch"),
    (["parallelism.grad_accum=0"], "parallelism.grad_accum"),
    (["train.warmup_steps=20"], "train.warmup_steps"),
    (["backend=ddp", "backend.offload_optimizer=true"], "backend.offload_optimizer"),
    (["backend=fsdp", "backend.zero_stage=2"], "backend.zero_stage"),
    (["backend=ds_zero2", "backend.offload_params=true"], "backend.offload_params"),
    (["backend=ds_zero2", "+backend.deepspeed.train_batch_size=999"], "backend.deepspeed.train_batch_size"),
    (["backend=ds_zero3", "+backend.deepspeed.zero_optimization.stage=1"], "zero_optimization.stage"),
    (["model.num_heads=5"], "model.num_heads"),
    (["data.name=wikipedia"], "data.name"),
    (["train.preempt_signal=TERM"], "train.preempt_signal"),
])
def test_rules_reject_bad_values_in_one_line_that_names_the_key(overrides, key):
    cfg = make(*overrides)
    with pytest.raises(validate.ConfigError) as err:
        validate.check(cfg, no_cuda)
    message = str(err.value)
    assert key in message and "\n" not in message


def test_a_non_positive_rate_is_told_its_default_and_a_count_one_or_more():
    # a walkthrough found `optim.lr=-1` told to "set optim.lr to 1 or more": a learning rate of 1 diverges
    lr = validate.problems(make("optim.lr=-1"), no_cuda)
    assert lr == ["optim.lr=-1.0: must be positive; the default is 0.001"]
    assert validate.problems(make("parallelism.micro_batch=0"), no_cuda)[0].endswith("to 1 or more")


def test_deepspeed_pass_through_keys_that_agree_or_are_new_are_accepted():
    cfg = make("backend=ds_zero2", "+backend.deepspeed.train_batch_size=4",
               "+backend.deepspeed.zero_optimization.round_robin_gradients=true")
    assert validate.problems(cfg, no_cuda) == []
    from harness.backends.deepspeed.json_config import ds_config

    merged = ds_config(cfg, 2, params=125_248)
    assert merged["zero_optimization"]["round_robin_gradients"] is True
    assert merged["zero_optimization"]["stage"] == 2 and merged["train_batch_size"] == 4


@pytest.mark.parametrize("parallelism, global_batch, grad_accum", [("cpu2", 8, 2), ("cpu2", 4, 1), ("gpu8", 128, 4)])
def test_a_pinned_global_batch_sets_grad_accum_for_the_world_size(parallelism, global_batch, grad_accum):
    cfg = make(f"parallelism={parallelism}", f"parallelism.global_batch={global_batch}", "parallelism.seq_len=64")
    assert validate.problems(cfg, lambda: 8) == []
    derive.apply_global_batch(cfg)
    par = cfg.parallelism
    assert par.grad_accum == grad_accum
    assert par.micro_batch * par.grad_accum * par.nproc_per_node * par.nnodes == global_batch


@pytest.mark.parametrize("parallelism", options("parallelism"))
@pytest.mark.parametrize("model", options("model"))
def test_every_model_runs_with_every_parallelism_preset(model, parallelism):
    cfg = compose_run([f"model={model}", f"parallelism={parallelism}"])
    assert validate.problems(cfg, lambda: 8) == []  # the device count stubbed: as on an 8-GPU node
    assert cfg.parallelism.seq_len <= cfg.model.max_positions
    preset = make(f"parallelism={parallelism}").parallelism.seq_len
    assert cfg.parallelism.seq_len == min(preset, cfg.model.max_positions)  # capped, never otherwise changed


def test_a_preset_seq_len_is_capped_with_a_note_but_an_asked_one_is_refused():
    cfg = make("model=tiny_gpt2", "parallelism=gpu1")
    assert derive.fit_to_model(cfg, []) == [
        "parallelism.seq_len=2048 of preset gpu1 capped to 512, the model.max_positions of tiny_gpt2"]
    assert cfg.parallelism.seq_len == 512
    asked = ["model=tiny_gpt2", "parallelism=gpu1", "parallelism.seq_len=2048"]
    cfg = compose_run(asked)
    assert cfg.parallelism.seq_len == 2048 and any("seq_len" in p for p in validate.problems(cfg, lambda: 8))


@pytest.mark.parametrize("backend", ["fsdp_hsdp", "fsdp_partial", "ds_zeropp"])
def test_a_hybrid_backend_on_one_node_runs_with_a_note_that_it_gains_nothing_there(backend):
    one = make(f"backend={backend}")
    assert validate.problems(one, no_cuda) == [] and any("gains nothing" in n for n in validate.notes(one))
    assert not validate.notes(make(f"backend={backend}", "parallelism.nnodes=2"))
    assert not validate.notes(make("backend=fsdp"))


def test_cpu_ranks_may_share_cores_with_a_note_but_not_cuda_ranks_gpus():
    cores = os.cpu_count() or 1
    shared = make(f"parallelism.nproc_per_node={cores + 1}")
    assert validate.problems(shared, no_cuda) == [] and "share" in validate.notes(shared)[0]
    assert validate.problems(make(f"parallelism.nproc_per_node={2 * cores + 1}"), no_cuda)
    assert validate.problems(make("parallelism=gpu8"), lambda: 1)


def test_a_sweep_run_dir_name_fits_in_a_file_name_and_stays_stable():
    # Hydra names each sweep run's dir after its overrides; 13 of them passed 255 bytes and every run crashed
    short = "backend=ddp,model=tiny_llama"
    assert schema.run_dirname(short) == short
    long = ",".join(f"train.option_{i}=value_{i}" for i in range(20))
    named = schema.run_dirname(long)
    assert len(named.encode()) <= schema.MAX_DIRNAME and named == schema.run_dirname(long)
    assert named != schema.run_dirname(long + ",x=1") and named.startswith("train.option_0=value_0")


def numeric_fields(cls=None, prefix=""):
    """Every int or float field of the run schema, dotted."""
    import dataclasses
    import typing

    from harness.config import schema

    cls = cls or schema.RunConfig
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            yield from numeric_fields(kind, f"{prefix}{f.name}.")
        elif kind in (int, float, typing.Optional[int], typing.Optional[float]):
            yield f"{prefix}{f.name}"


@pytest.mark.parametrize("key", list(numeric_fields()))
def test_every_numeric_field_is_range_checked_before_any_rank_starts(key):
    """-1 is out of range for every numeric field (and 1.5 for Adam's betas): the rules refuse it, naming the
    key, in the parent. Before, optim.lr=-1 and optim.beta1=1.5 failed only inside the ranks, after 10 s."""
    from harness.config import rules

    assert key in {*rules.POSITIVE, *rules.NON_NEGATIVE, *rules.BELOW_ONE, *rules.POSITIVE_WHEN_SET,
                   *rules.ranged_elsewhere()}, f"{key}: no range rule"
    for bad in (-1, 1.5) if key in rules.BELOW_ONE else (-1,):
        cfg = copy.deepcopy(default_config())
        OmegaConf.update(cfg, key, bad)
        found = rules.problems(cfg)
        assert any(key in problem for problem in found), (key, bad, found)


@functools.lru_cache(maxsize=1)
def default_config():
    return compose_run([])


def test_a_family_without_theory_or_an_unknown_one_is_refused_in_one_line(monkeypatch):
    """A strategy family is registered by name (config/families.py). One whose package implements no theory is
    refused before any rank starts, naming what it lacks: it never falls back to another family's predictions."""
    import sys
    import types

    from harness.config import families

    class Untheorised(families.Family):
        name = "untheorised"
        strategy_class_name = "Nothing"

        def layout(self, backend, s):  # one theory method of eight: not enough
            return {}

    module = types.ModuleType("untheorised_family.family")
    module.FAMILY = Untheorised()
    monkeypatch.setitem(sys.modules, "untheorised_family.family", module)
    monkeypatch.setitem(families.FAMILIES, "untheorised", "untheorised_family")
    with pytest.raises(families.ConfigError) as err:
        families.get("untheorised")
    message = str(err.value)
    assert "\n" not in message and message.startswith("backend.family=untheorised: has no theory")
    assert "paper_stage" in message and "collectives" in message and "layout," not in message
    cfg = compose_run(["backend=ddp"])
    cfg.backend.family = "untheorised"
    assert validate.backend_rules(cfg) == [message]  # the parent's rules say it, in the same line
    with pytest.raises(families.ConfigError, match="backend.family=nosuch: unknown strategy family"):
        families.get("nosuch")


def test_composing_a_matrix_at_once_gives_each_runs_own_config():
    """config.compose_many, and compose() through it (Hydra once a process per group choice, by a loader made once
    with each config file read once, plain values set on a copy by Hydra's own step), resolves every cell exactly
    as Hydra's public compose() of its overrides does, added keys and derived fields included, and refuses a bad
    value or an unknown option with Hydra's own error."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import ConfigCompositionException, MissingConfigException
    from omegaconf import OmegaConf

    from harness.config import schema
    from harness.config.compose import CONF, _derived, compose, compose_many, composed_as_given
    from harness.studies.memory import check as memory_check

    def _hydra(overrides):  # Hydra's own, set up for each call as its documentation shows
        schema.register()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    cells = [["profile=parity", *c, *memory_check.CELL, "train.memory_steps=3"]
             for c in memory_check.matrix(["ddp", "ds_zero3"], ["tiny_llama", "tiny_gpt2"], ["fp32", "bf16"], [True])]
    cells += [["model=small_llama", "backend=ds_zero3", "parallelism.seq_len=16", "backend.bucket_elements=400000",
               "+backend.deepspeed.zero_optimization.stage3_max_reuse_distance=0"],
              ["parallelism.global_batch=8", "parallelism.micro_batch=2", "optim.lr=3e-4"],
              # values under a group, set after the groups as Hydra sets them: a user's config.json (which names the
              # run and fills the model's fields), a list, a backend's own field
              ["model.hf_config=hf/tiny_mistral", "model.num_layers=3", "data=files", "data.files=[a.txt,b.txt]",
               "backend=fsdp1", "backend.use_orig_params=true", "model.init=meta"],
              ["experiment=axes"], ["parallelism=gpu8", "backend=ds_zero3_offload", "model=llama_1b"],
              ["backend=fsdp", "parallelism=cpu2", "model=tiny_qwen2", "logger=none"]]
    together = compose_many(cells)
    for overrides, cfg, again in zip(cells, together, [compose(c) for c in cells]):
        theirs = _hydra(overrides)
        # as given, before the parent derives anything (the rules' and the command line's checks read this)
        assert OmegaConf.to_container(composed_as_given(overrides), resolve=True) == OmegaConf.to_container(
            theirs, resolve=True)
        whole = OmegaConf.to_container(_derived(theirs, overrides), resolve=True)
        assert OmegaConf.to_container(cfg, resolve=True) == whole == OmegaConf.to_container(again, resolve=True)
    # a wrong type, an unknown key, each also under a group: Hydra's own errors
    for bad in (["train.steps=ten"], ["train.stpes=10"], ["model.num_layers=two"], ["backend.stage=2"],
                ["backend=ds_zero4"]):
        error = MissingConfigException if bad == ["backend=ds_zero4"] else ConfigCompositionException
        with pytest.raises(error) as theirs:
            _hydra(bad)
        for ours_of in (compose, composed_as_given):
            with pytest.raises(error) as ours:
                ours_of(bad)
            assert str(ours.value) == str(theirs.value)


def test_the_preemption_signal_is_submitits_inside_a_slurm_job_and_a_requeue_resumes_the_same_run():
    import signal

    from harness.core.preemption import signal_of
    from harness.launcher.resume import comparable as _comparable
    from harness.launcher.slurm import resumed

    assert signal_of("auto", {}) is None  # not a SLURM job: nothing will warn it
    assert signal_of("auto", {"SLURM_JOB_ID": "7"}) == signal.SIGUSR2
    assert signal_of("auto", {"SLURM_JOB_ID": "7", "SUBMITIT_PREEMPT_SIGNAL": "USR1"}) == signal.SIGUSR1
    assert signal_of("none", {"SLURM_JOB_ID": "7"}) is None and signal_of("usr2", {}) == signal.SIGUSR2
    # submitit requeues the job with these arguments: the same overrides, resuming from the run dir's latest
    args = (["backend=fsdp", "train.resume=/some/step_4"], "hydra.sweep.dir", 0, "job_id_for_0", {})
    assert resumed(args) == (["backend=fsdp", "train.resume=auto"], *args[1:])
    # and a job requeued after its run finished ok finds it done: train.resume is how a run goes on, not what it is
    assert _comparable(make("train.resume=auto")) == _comparable(make())


def test_resume_auto_finds_the_newest_unfinished_run_of_the_same_config_that_holds_a_checkpoint(tmp_path):
    """What `train.resume=auto` goes on from in the default run dir (launcher/resume.py): runs that ended ok,
    runs of another config and runs without a complete checkpoint are passed over; the newest other one wins."""
    import json
    import time

    from harness.core.checkpoint_dirs import MARKER, step_dir
    from harness.launcher.resume import comparable, unfinished_run

    def run(name, cfg, status, checkpoint=True):
        root = tmp_path / name
        root.mkdir()
        (root / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        if status:
            (root / "summary.json").write_text(json.dumps({"status": status}))
        if checkpoint:
            step_dir(root / "checkpoints", 2).mkdir(parents=True)
            (step_dir(root / "checkpoints", 2) / MARKER).write_text("{}")
        time.sleep(0.01)  # the newest by modification time
        return root

    cfg, other = make("train.steps=6"), make("train.steps=7")
    wanted = comparable(make("train.steps=6", "train.resume=auto"))
    assert unfinished_run(tmp_path, wanted) is None
    older = run("a", cfg, "interrupted")
    run("b", cfg, "ok")
    run("c", other, "failed")
    faulted = OmegaConf.merge(cfg, {"fault": {"kind": "kill", "step": 4}})
    run("d", cfg, None, checkpoint=False)
    assert unfinished_run(tmp_path, wanted) == older
    newer = run("e", cfg, None)  # stopped before it wrote a summary
    assert unfinished_run(tmp_path, wanted) == newer
    killed = run("f", faulted, "failed")  # a fault drill's run: the fault is how it ended, not what it trains
    assert unfinished_run(tmp_path, wanted) == killed
