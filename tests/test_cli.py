"""Bad input through the real CLI: a message naming the key, a non-zero exit, no traceback, no rank started,
all within 10 seconds. Rule violations (validate.py) are exactly one line; Hydra's own errors (unknown
options, misspelt keys, wrong types) are Hydra's short message, which names the key and the options."""
from __future__ import annotations

import time

import pytest

from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from conftest import REPO, cli

from harness.config import derive, overrides, rules, schema
from harness.config.compose import composed_as_given


BAD_INPUT = [
    # unknown group options (Hydra lists the available ones)
    (["backend=nope"], "backend/nope"),
    (["model=gpt5"], "model/gpt5"),
    (["parallelism=tpu"], "parallelism/tpu"),
    (["data=imagenet"], "data/imagenet"),
    (["data.name=imagenet"], "data.name=imagenet"),
    (["experiment=nope"], "experiment/nope"),
    # misspelt keys (the typed schema refuses them; Hydra says how to add a new key)
    (["train.stepz=5"], "train.stepz"),
    (["optim.learning_rate=0.1"], "optim.learning_rate"),
    (["backend.zero_stag=2"], "backend.zero_stag"),
    (["parallelism.microbatch=2"], "parallelism.microbatch"),
    # keys added with + that the schema does not have (Hydra accepts them; the rules refuse them)
    (["+train.stpes=100"], "train.stpes: not a key of the config schema (added with +?); did you mean train.steps?"),
    (["+train.no_such_key=1"], "train.no_such_key: not a key of the config schema"),
    (["+optim.learning_rate=0.1"], "optim.learning_rate"),
    # inside the DeepSpeed pass-through, DeepSpeed's own validation runs in the parent
    (["backend=ds_zero2", "+backend.deepspeed.zero_optimization.overlap_com=true"],
     "backend.deepspeed.zero_optimization.overlap_com: DeepSpeed refuses it"),
    (["backend=ds_zero3", "+backend.deepspeed.wall_clock_breakdwn=true"], "did you mean wall_clock_breakdown?"),
    # wrong types
    (["train.steps=ten"], "train.steps"),
    (["optim.lr=fast"], "optim.lr"),
    (["train.compile=maybe"], "train.compile"),
    (["train.activation_checkpointing=maybe"], "train.activation_checkpointing=maybe: unknown policy"),
    (["parallelism.nproc_per_node=1.5"], "parallelism.nproc_per_node"),
    # values the device or backend cannot honour
    (["train.precision=fp16"], "train.precision=fp16"),
    (["backend=ddp", "backend.offload_optimizer=true"], "backend.offload_optimizer=true"),
    (["backend=fsdp", "backend.offload_params=true"], "backend.offload_params=true"),
    (["backend=ds_zero2", "backend.offload_params=true"], "backend.offload_params=true"),
    (["backend=ds_zero3", "backend.zero_stage=7"], "backend.zero_stage=7"),
    (["parallelism.nproc_per_node=64"], "parallelism.nproc_per_node=64"),
    (["parallelism=gpu8"], "parallelism.nproc_per_node=8"),
    # sizes
    (["parallelism.micro_batch=0"], "parallelism.micro_batch=0"),
    (["parallelism.grad_accum=-1"], "parallelism.grad_accum=-1"),
    (["parallelism.seq_len=100000"], "parallelism.seq_len=100000"),
    (["train.steps=0"], "train.steps=0"),
    (["train.warmup_steps=20"], "train.warmup_steps=20"),
    (["model.num_heads=5"], "model.num_heads=5"),
    (["model.num_kv_heads=3"], "model.num_kv_heads=3"),
    # a GELU the theory does not count, and a GELU on a SwiGLU family (the default model is llama's)
    (["model=tiny_gpt2", "model.activation=relu"], "model.activation=relu: not a GELU the theory counts"),
    (["model.activation=gelu"], "model.activation=gelu: the llama family's MLP is SwiGLU"),
    (["dist.timeout_s=0"], "dist.timeout_s=0"),
    (["backend.bucket_elements=-1"], "backend.bucket_elements=-1"),
    (["train.memory_budget_bytes=-5"], "train.memory_budget_bytes=-5"),
    (["train.memory_snapshot=true"], "train.memory_snapshot=true: the snapshot records CUDA's caching allocator"),
    (["fault.kind=raise", "fault.rank=2"], "fault.rank=2"),
    (["logger.init_timeout_s=0"], "logger.init_timeout_s=0"),
    (["logger.mode=offline", "dist.timeout_s=30"], "logger.init_timeout_s=60: not below dist.timeout_s=30"),
    # a world size that does not divide the pinned global batch, and a grad_accum that contradicts it
    (["parallelism.global_batch=6"], "parallelism.global_batch=6: not divisible by micro_batch 2 x world size 2"),
    (["parallelism.global_batch=8", "parallelism.grad_accum=3"], "parallelism.grad_accum=3: contradicts"),
    (["parallelism.global_batch=-4"], "parallelism.global_batch=-4"),
    # a disk without room for results (the real full-disk case: tests/test_environment_faults.py)
    (["paths.min_free_mib=1000000000"], "below paths.min_free_mib=1000000000"),
    # enumerations
    (["train.on_nonfinite=ignore"], "train.on_nonfinite=ignore"),
    (["model.init=lazy"], "model.init=lazy"),
    (["logger.mode=sometimes"], "logger.mode=sometimes"),
    (["fault.kind=meteor"], "fault.kind=meteor"),
    # output dirs: a run or sweep name cannot escape the results root (checked before Hydra creates it)
    (["hydra.run.dir=/tmp/shardbench-outside"], "outside paths.root"),
    (["-m", "sweep.name=../../escape"], "outside paths.root"),
    # DeepSpeed pass-through keys that contradict the harness
    (["backend=ds_zero2", "+backend.deepspeed.train_batch_size=999"], "backend.deepspeed.train_batch_size=999"),
    (["backend=ds_zero2", "+backend.deepspeed.gradient_accumulation_steps=8"],
     "backend.deepspeed.gradient_accumulation_steps=8"),
    (["backend=ds_zero3", "+backend.deepspeed.bf16.enabled=true"], "backend.deepspeed.bf16.enabled=True"),
    (["backend=ds_zero1", "+backend.deepspeed.zero_optimization.stage=2"],
     "backend.deepspeed.zero_optimization.stage=2"),
]


# Every case goes through the real CLI once per category (a process costs ~1 s of imports, so not all 56):
# exit code, the message, no traceback, no rank. Every case goes through the parent's own composition and
# rules in-process below, which is where each message comes from. The DeepSpeed pass-through goes through the
# CLI with a key the harness contradicts; a key DeepSpeed's own schema refuses (overlap_com) only in-process,
# where it costs no second import of DeepSpeed (2.3 s)
THROUGH_THE_CLI = {"backend=nope", "train.stepz=5", "+train.stpes=100", "train.steps=ten", "train.precision=fp16",
                   "backend=ds_zero2 +backend.deepspeed.train_batch_size=999", "parallelism.seq_len=100000",
                   "parallelism.global_batch=6", "model.init=lazy", "paths.min_free_mib=1000000000",
                   "hydra.run.dir=/tmp/shardbench-outside", "-m sweep.name=../../escape"}
CLI_CASES = [(o, says) for o, says in BAD_INPUT if " ".join(o) in THROUGH_THE_CLI]


@pytest.mark.parametrize("overrides, says", CLI_CASES, ids=[" ".join(o) for o, _ in CLI_CASES])
def test_bad_input_fails_before_any_rank_starts(tmp_path, overrides, says):
    started = time.monotonic()
    proc = cli(*overrides, f"paths.root={tmp_path}", "logger=none", timeout=120)
    assert time.monotonic() - started < 10
    assert proc.returncode != 0
    assert says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    # no rank started: torchrun never ran, so no launcher log or rank outcome exists anywhere
    assert not list(tmp_path.rglob("launcher.log")) and not list(tmp_path.rglob("rank*.json"))
    if "-m" not in overrides:  # and a refused single run leaves no run dir (a sweep records an invalid row)
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), list(tmp_path.rglob("*"))


def refusal(overrides) -> str:
    """What the parent says of these overrides: Hydra's composition error, or the rules' problems (checked, as
    the parent does, after a preset's seq_len is fitted and before a global batch sets grad_accum)."""
    try:
        cfg = composed_as_given(list(overrides))  # Hydra's own composition and errors (tests/test_config.py)
        derive.fit_to_model(cfg, overrides)
    except (ConfigCompositionException, OmegaConfBaseException) as err:
        return f"{err} {err.__cause__ or ''}"
    return "; ".join(rules.problems(cfg) + rules.output_problems(cfg.paths, str(REPO / cfg.paths.root)))


schema.register()
IN_PROCESS = [(o, says) for o, says in BAD_INPUT if not {"-m"} & set(o) and not o[0].startswith("hydra.")]


@pytest.mark.parametrize("overrides, says", IN_PROCESS, ids=[" ".join(o) for o, _ in IN_PROCESS])
def test_every_bad_input_is_refused_with_a_message_naming_it(overrides, says):
    assert says in refusal(overrides)


def test_rule_violations_are_exactly_one_line(tmp_path):
    proc = cli("train.precision=fp16", f"paths.root={tmp_path}", "logger=none", timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("shardbench: invalid config: train.precision=fp16")


def test_an_unusable_results_root_is_refused_before_anything_is_written():
    proc = cli("paths.root=/proc/shardbench", "logger=none", timeout=60)
    assert proc.returncode == 2 and "paths.root=/proc/shardbench" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_escaping_names_create_nothing_outside_the_root(tmp_path):
    root = tmp_path / "root"
    cli("-m", "sweep.name=../../escape", f"paths.root={root}", "logger=none", timeout=60)
    cli("hydra.run.dir=" + str(tmp_path / "outside"), f"paths.root={root}", "logger=none", timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["root"])


# what Hydra itself refused in 7-15 lines: unknown group options, keys the schema lacks, values of the wrong type
HYDRAS_OWN = [(o, says) for o, says in BAD_INPUT if not o[0].startswith("+")  # (added keys: the rules')
              and (says.startswith(tuple(f"{g}/" for g in overrides.GROUPS)) or says in {"train.stepz", "optim.learning_rate", "backend.zero_stag", "parallelism.microbatch",
                          "train.steps", "optim.lr", "train.compile", "parallelism.nproc_per_node"})]


@pytest.mark.parametrize("args, says", HYDRAS_OWN, ids=[" ".join(o) for o, _ in HYDRAS_OWN])
def test_mistakes_hydra_would_report_at_length_are_one_line_with_the_nearest_name(args, says):
    found = overrides.problem(args)
    assert found and says in found and "\n" not in found, found
    if args == ["train.stepz=5"]:
        assert "did you mean train.steps?" in found
    if args == ["backend=nope"]:
        assert "options: ddp, ds_zero1" in found


def test_valid_overrides_and_what_hydra_owns_pass_the_precheck():
    assert overrides.problem(["-m", "backend=ddp,fsdp", "model=tiny_gpt2", "train.steps=5", "optim.lr=1e-3",
                              "model.num_kv_heads=null", "+backend.deepspeed.zero_optimization.stage=2",
                              "hydra.run.dir=/tmp/x", "hydra/launcher=slurm", "backend=glob(*)", "logger.tags=[a,b]",
                              "train.seed=range(3)", "experiment=compare_all", "--info", "defaults-tree"]) is None


TOOL_MISTAKES = [
    ("train.stepz=3", "did you mean train.steps?"),  # a misspelt key
    ("backend=ds_zero4", "did you mean ds_zero3?"),  # an unknown backend
    ("model=llama3_8B", "did you mean llama3_8b?"),  # an unknown model
    ("--device-gb=80", "--device-gb: no such flag"),  # a misspelt flag
]


@pytest.mark.parametrize("tool", ["train", "estimate", "advise"])
@pytest.mark.parametrize("arg, says", TOOL_MISTAKES)
def test_the_first_commands_refuse_a_mistake_in_one_line_before_heavy_imports(tool, arg, says):
    # a walkthrough found shardbench estimate dumping 28-70-line tracebacks after 6-10 s, and the advisor's
    # `--device-gib 1` and `model=llama3_8B` cryptic: every command now checks its line as train does
    import subprocess
    import sys

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", tool, arg], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr[-800:]
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 5


# commands whose only arguments are their flags and positionals: a stray override is refused, not read
TAKES_NO_OVERRIDES = {"advise-agreement", "advise-field", "axes", "dashboard", "device-costs", "export", "loss-agreement", "published", "report",
                      "warm-ops", "gpu-review"}


def test_every_shardbench_command_refuses_each_mistake_in_one_line(tmp_path, capsys, monkeypatch):
    """Every command, in-process through `shardbench <command>`: a misspelt key, an unknown backend, an unknown
    model, a misspelt flag and an unsupported model_type are one line and exit 2 (config/command_line.py), never
    a traceback or a started run. Train, whose entry point is Hydra's, is walked in processes above."""
    import json
    import sys

    from harness import commands

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "n_routed_experts": 4}))
    mistakes = [*TOOL_MISTAKES, (f"model.hf_config={tmp_path}", "a deepseek_v3 mixture of experts")]
    walked = [name for name in commands.commands() if name != "train"]
    assert len(walked) >= 20, walked
    for name in walked:
        for arg, says in mistakes:
            monkeypatch.setattr(sys, "argv", ["pytest"])
            started = time.monotonic()
            code = commands.main([name, arg])
            out = capsys.readouterr()
            lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
            assert code == 2 and len(lines) == 1, (name, arg, lines[-5:])
            assert time.monotonic() - started < 5, (name, arg)
            if arg.startswith("--") or name not in TAKES_NO_OVERRIDES:
                assert says in lines[0], (name, arg, lines)


def test_an_unsupported_model_type_is_one_line_from_the_estimator_and_the_advisor(tmp_path, capsys):
    import json

    from harness.studies.advise import answer as advise_answer
    from harness.studies.predict import estimate
    from harness.config.command_line import one_line

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "max_position_embeddings": 512}))
    for tool, main in (("estimate", estimate.main), ("advise", advise_answer.main)):
        args = [f"model.hf_config={tmp_path}", *(["--dry-run"] if tool == "advise" else [])]
        assert one_line(tool, lambda: main(args)) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "multi-head latent attention" in err[0], err


def test_one_shardbench_command_runs_every_tool_and_names_the_nearest_one(capsys):
    """`shardbench <command>` (the console script make install puts in .venv/bin) and `python -m harness <command>`
    read one table (harness/commands.py): every row's function and check resolve, a wrong name is one line."""
    from harness import commands

    found = commands.commands()
    assert {"train", "estimate", "advise", "report", "bench", "memory-check", "gpu-check", "axes"} <= set(found)
    assert all(summary and not summary.endswith((" on", " in", " the")) for summary in found.values()), found
    assert commands.main(["--help"]) == 0 and "memory-check" in capsys.readouterr().out
    assert commands.main(["memroy-check"]) == 2
    assert capsys.readouterr().err.strip() == "shardbench: no command memroy-check; did you mean memory-check?"
    for row in commands.COMMANDS.values():  # a row naming a function that is not there fails here, not for a user
        assert callable(commands.resolve(row.target)) and (row.check is None or callable(commands.resolve(row.check)))


def test_python_dash_m_harness_is_the_same_table():
    """`python -m harness` lists the table and runs a command's check as shardbench does (one process, 1-2 s)."""
    import subprocess
    import sys

    from harness import commands

    listed = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and all(f"  {name} " in listed.stdout for name in commands.COMMANDS), listed.stdout
    refused = subprocess.run([sys.executable, "-m", "harness", "estimate", "--devce-gib", "80"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("estimate: invalid input: --devce-gib"), refused


def test_the_installed_shardbench_script_refuses_bad_input_in_one_line(capsys):
    import subprocess

    from harness.config.command_line import one_line
    from harness.studies.predict import estimate

    script = REPO / ".venv" / "bin" / "shardbench"
    if not script.exists():
        pytest.skip("no .venv/bin/shardbench: make install creates it")
    # the script, with a mistake its line check refuses before the heavy imports (0.5 s, not 5)
    out = subprocess.run([str(script), "estimate", "backend=ds_zero4"], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "did you mean ds_zero3?" in lines[0], lines
    # and a flag whose value a rule refuses after composing: the same one line (in this process, whose imports
    # are already paid)
    assert one_line("estimate", lambda: estimate.main(["--tp", "3"])) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "parallelism.tp=3: must divide the 2 ranks of a node" in err[0], err


OUT_OF_RANGE = [
    # issue 74's walkthrough: each printed a wrong answer or a traceback, and exited as if fine
    (["estimate", "parallelism.micro_batch=-1"], "parallelism.micro_batch=-1: must be positive"),
    (["advise", "--global-batch", "-4", "--dry-run"], "argument --global-batch: -4: must be above 0"),
    (["capacity", "--budget-mib", "-5"], "argument --budget-mib: -5: must be above 0"),
    (["collectives", "parallelism.tp=3"], "parallelism.tp=3: collectives times each collective over whole ranks"),
    (["estimate", "--backends", "fsdp,ds_zero4"], "ds_zero4: no such backend in conf/backend/; did you mean ds_zero3?"),
    # a sequence past the model's positions was estimated as if the model could take it; train refuses it
    (["estimate", "model=tiny_llama", "parallelism.seq_len=100000"],
     "parallelism.seq_len=100000: longer than model tiny_llama's 512 positions"),
    (["export", "/nonexistent/step_0000003", "/tmp/shardbench-export"], "/nonexistent/step_0000003: no such directory"),
    (["gpu-review", "--budget-s", "0"], "argument --budget-s: 0: must be above 0"),
    # an axis's degrees to search: a traceback (int()) or a ZeroDivisionError before they were checked
    (["estimate", "--cp", "0"], "argument --cp: 0: must be above 0"),
    (["estimate", "--tp", "x"], "argument --tp: 'x' is not an integer"),
    (["scale-check", "--report-only", "--cp-grid", "llama3_1_8b:8:abc:2"],
     "--cp-grid llama3_1_8b:8:abc:2: 'abc' is not a positive integer"),
    (["scale-check", "--report-only", "--cp-grid", "llama3_1_8b:8:4096:2:ring"],
     "--cp-grid llama3_1_8b:8:4096:2:ring: expected"),
    (["scale-check", "--report-only", "--ep-grid", "qwen3_30b_a3b:64:0"],
     "--ep-grid qwen3_30b_a3b:64:0: '0' is not a positive integer"),
    (["scale-check", "--report-only", "--ep-grid", "qwen3_30b_a3b:64"], "--ep-grid qwen3_30b_a3b:64: expected"),
    (["scale-check", "--report-only", "--tp-grid", "llama_1b:64:0"], "--tp-grid llama_1b:64:0: '0' is not a positive integer"),
]


@pytest.mark.parametrize("argv, says", OUT_OF_RANGE, ids=[" ".join(a) for a, _ in OUT_OF_RANGE])
def test_out_of_range_values_are_refused_in_one_line(argv, says, capsys, monkeypatch):
    import sys

    from harness import commands

    monkeypatch.setattr(sys, "argv", ["pytest"])
    started = time.monotonic()
    code = commands.main(argv)
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0], lines[-5:]
    assert time.monotonic() - started < 5


def test_memory_check_fails_on_a_refused_backend_it_was_asked_for_not_on_one_its_default_list_brought():
    """`memory-check parallelism.cp=2` ran the backends that take cp and exited 1 on FSDP1's refusal, which only
    its default list (every flat backend) had brought; a named backend refused, or any miss, still fails it."""
    from harness.studies.memory.check import exit_code

    ran = {"name": "fsdp", "refused": None, "error_pct": 4.0, "error_less_held_pct": 4.0}
    refused = {"name": "fsdp1", "refused": "parallelism.cp=2: torch's context parallelism composes with FSDP2"}
    assert exit_code([ran, refused], 10, backends_named=False) == 0
    assert exit_code([ran, refused], 10, backends_named=True) == 1
    assert exit_code([{**ran, "error_pct": 23.0, "error_less_held_pct": 23.0}], 10, backends_named=False) == 1
