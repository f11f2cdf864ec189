"""Property-based: any combination of backend x model x parallelism x precision x sizes either validates, and
then everything the parent derives from it before starting ranks (parameter count, DeepSpeed JSON, the
memory model) works, or it is refused by named rules, each naming the key it is about. Valid draws that this
machine can run then train inside real ranks, which must not crash."""
from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from conftest import BACKENDS, cli
from harness.config import derive, schema
from harness.config.compose import composed_as_given
from harness.config import rules as validate
from harness.backends.deepspeed.json_config import ds_config
from harness.runtime import models
from harness.theory.predict import predict

schema.register()
MODELS = ["tiny_llama", "tiny_gpt2", "small_llama", "gpt2_124m", "llama_1b", "llama_7b"]
RULE = re.compile(r"^[a-z_]+(\.[a-z_0-9.]+)+(=\S*)?[,:]")  # every message starts with the key it is about


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backend=st.sampled_from(BACKENDS), model=st.sampled_from(MODELS),
       parallelism=st.sampled_from(["cpu2", "gpu1", "gpu8"]), precision=st.sampled_from(["fp32", "bf16", "fp16"]),
       micro_batch=st.integers(-1, 8), grad_accum=st.integers(-1, 4), seq_len=st.integers(1, 5000),
       cuda_devices=st.integers(0, 8))
def test_every_combination_validates_or_is_refused_by_a_named_rule(backend, model, parallelism, precision,
                                                                   micro_batch, grad_accum, seq_len, cuda_devices):
    cfg = composed_as_given([
        f"backend={backend}", f"model={model}", f"parallelism={parallelism}", f"train.precision={precision}",
        f"parallelism.micro_batch={micro_batch}", f"parallelism.grad_accum={grad_accum}",
        f"parallelism.seq_len={seq_len}"])
    problems = validate.problems(cfg, lambda: cuda_devices)
    for p in problems:
        assert RULE.match(p), p
    # the rules that must fire
    if micro_batch <= 0:
        assert any(p.startswith("parallelism.micro_batch") for p in problems)
    if grad_accum <= 0:
        assert any(p.startswith("parallelism.grad_accum") for p in problems)
    if problems:
        return
    assert seq_len <= cfg.model.max_positions
    assert not (precision == "fp16" and cfg.parallelism.device == "cpu")
    assert cfg.parallelism.device == "cpu" or cfg.parallelism.nproc_per_node <= cuda_devices
    # a valid config: what the parent and the ranks derive from it before training must not crash
    world = derive.world_size(cfg)
    counts = models.param_count(cfg.model)
    predicted = predict(cfg, world, counts)
    assert predicted["memory/model_states_predicted_bytes"] > 0
    if cfg.backend.family == "deepspeed":
        ds = ds_config(cfg, world, counts["total"])
        assert ds["train_batch_size"] == micro_batch * grad_accum * world


# Each example is a real run (~15 s), so `make test` draws 2 (the fixture sweeps run every backend already);
# SHARDBENCH_PROPERTY_RUNS=40 draws more.
REAL_RUNS = int(os.environ.get("SHARDBENCH_PROPERTY_RUNS", "2"))


@pytest.mark.slow
@pytest.mark.drill  # real runs (26 s): make test-drills and CI, to keep make test under 10 minutes
@settings(max_examples=REAL_RUNS, deadline=None, phases=[Phase.generate],  # real runs: no shrinking
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(backend=st.sampled_from(BACKENDS), model=st.sampled_from(["tiny_llama", "tiny_gpt2"]),
       precision=st.sampled_from(["fp32", "bf16"]), micro_batch=st.integers(1, 3), grad_accum=st.integers(1, 3),
       seq_len=st.integers(1, 64),
       checkpointing=st.sampled_from(["none", "full", "every_2", "selective_op", "true"]), init=st.sampled_from(["host", "meta"]),
       global_batch=st.sampled_from([0, 0, 4, 8, 12]), profile=st.sampled_from(["native", "parity"]),
       ranks=st.sampled_from([2, 3]))
def test_valid_draws_train_inside_real_ranks(backend, model, precision, micro_batch, grad_accum, seq_len,
                                             checkpointing, init, global_batch, profile, ranks):
    overrides = [f"backend={backend}", f"model={model}", f"train.precision={precision}", f"profile={profile}",
                 f"parallelism.nproc_per_node={ranks}",
                 f"parallelism.micro_batch={micro_batch}", f"parallelism.grad_accum={grad_accum}",
                 f"parallelism.global_batch={global_batch}",
                 f"parallelism.seq_len={seq_len}", f"train.activation_checkpointing={checkpointing}",
                 f"model.init={init}"]
    cfg = composed_as_given(overrides)
    assume(not validate.problems(cfg))
    root = Path(tempfile.mkdtemp(prefix="shardbench-prop-"))
    proc = cli(*overrides, "logger=none", "train.steps=2", "train.warmup_steps=1", "train.measure_flops=false",
               "train.profile_memory=false", "train.profile=true",
               f"paths.root={root}", "hydra.run.dir=${paths.root}/runs/draw", timeout=300)
    summary = json.loads((root / "runs" / "draw" / "summary.json").read_text())
    assert proc.returncode == 0 and summary["status"] == "ok", (overrides, summary.get("reason"))
    # train.profile=true: a gzipped Chrome trace per rank, covering the loop's marked steps
    for rank in range(ranks):
        with gzip.open(root / "runs" / "draw" / "traces" / f"rank{rank}.json.gz", "rt") as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        assert {"shardbench/step", "shardbench/forward", "shardbench/backward", "shardbench/optimizer"} <= names
