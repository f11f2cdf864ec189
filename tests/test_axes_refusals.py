"""float8 training and DeepCompile (issue 48's axes that need a GPU), on CPU: refused in one line where they
cannot run, and their theory (theory/float8.py) held against what torchao converts, in process."""
from __future__ import annotations

import pytest

from harness.config import float8_check, rules
from harness.config.compose import compose
from harness.runtime import models
from harness.theory import float8

LLAMA_GPU = ["model=tiny_llama", "parallelism.device=cuda", "parallelism.nproc_per_node=1", "train.precision=bf16"]


@pytest.mark.parametrize("overrides, expected", [
    (["backend=fsdp", "train.precision=bf16", "train.float8=tensorwise"],
     "train.float8=tensorwise: float8 matmuls (torch._scaled_mm) need a CUDA GPU of compute capability 8.9"),
    (["backend=ds_zero2", "train.precision=bf16", "train.float8=rowwise"], "train.float8=rowwise: not under ds_zero2"),
    (["backend=fsdp", "model=tiny_gpt2", "train.precision=bf16", "train.float8=rowwise"],
     "train.float8=rowwise: model family gpt2's matmuls are transformers' Conv1D"),
    (["backend=ddp", "train.float8=tensorwise"], "train.float8=tensorwise: float8 matmuls are run inside bf16"),
    (["backend=ds_zero3", "backend.deepcompile=true"], "backend.deepcompile=true: DeepCompile's passes put"),
    (["backend=fsdp", "backend.deepcompile=true"], "backend.deepcompile=true: not an option of fsdp"),
    (["backend=ds_zero3", "train.float8=fp4"], "train.float8=fp4: unknown value; use one of none, tensorwise"),
])
def test_float8_and_deepcompile_are_refused_in_one_line_where_they_cannot_run(overrides, expected):
    found = rules.problems(compose(overrides))
    assert found and found[0].startswith(expected), found
    assert "\n" not in found[0]


def test_on_a_gpu_the_capability_and_the_stage_decide():
    """The rules a CUDA host would apply, with its capability given: an A100 (sm80) is refused float8, an
    H100 (sm90) is not; DeepCompile takes ZeRO-1 and ZeRO-3 only."""
    cfg = compose([*LLAMA_GPU, "backend=fsdp", "train.float8=tensorwise"])
    assert "sm80" in float8_check.problems(cfg, capability=lambda: (8, 0))[0]
    from importlib.util import find_spec

    on_h100 = float8_check.problems(cfg, capability=lambda: (9, 0))  # passes, or names the missing torchao
    assert on_h100 == ([] if find_spec("torchao") else [
        "train.float8=tensorwise: torchao is not installed; pip install '.[float8]' (torchao==0.18.0, the version "
        "the harness pins)"])
    from harness.backends.deepspeed.check import deepcompile_rules

    assert deepcompile_rules(compose([*LLAMA_GPU, "backend=ds_zero3", "backend.deepcompile=true"])) == []
    assert "stages 1 and 3, not 2" in deepcompile_rules(
        compose([*LLAMA_GPU, "backend=ds_zero2", "backend.deepcompile=true"]))[0]


def test_the_runtime_filter_chooses_the_weights_the_theory_counts():
    """runtime/float8.module_filter (what convert_to_float8_training is given) selects exactly the Linears whose
    weights theory/float8.converted counts: the blocks' projections with both dimensions multiples of 16, not
    the output layer."""
    from harness.runtime import float8 as runtime_float8

    for overrides, per_block in ((["model.intermediate_size=168"], 4), ([], 7)):  # 168: the MLP stays bf16
        cfg = compose(["model=tiny_llama", *overrides])
        predicted = float8.converted(models.param_count(cfg.model)["tensors"], cfg.model.family)
        model = models.build(cfg.model, device="meta")
        chosen = {n: m for n, m in model.named_modules() if runtime_float8.module_filter(m, n)}
        assert len(chosen) == predicted["weights"] == per_block * cfg.model.num_layers, sorted(chosen)
        assert predicted["elements"] == sum(m.weight.numel() for m in chosen.values())
        assert not any("lm_head" in n for n in chosen)


def test_the_theory_converts_the_linears_torchao_converts():
    """Where torchao is installed (pip install '.[float8]'; the GPU machine's wheels): its
    convert_to_float8_training runs on CPU too (only its matmuls need a GPU), and the Linears it swaps with the
    harness's filter are the weights theory/float8.converted counts."""
    pytest.importorskip("torchao")
    from harness.runtime import float8 as runtime_float8

    cfg = compose(["model=tiny_llama", "model.intermediate_size=168"])  # 168 = 16 x 10.5: the MLP stays bf16
    counts = models.param_count(cfg.model)
    predicted = float8.converted(counts["tensors"], cfg.model.family)
    model = models.build(cfg.model, device="meta")
    applied = runtime_float8.convert(model, "tensorwise", fsdp_all_gather=True)
    swapped = {n: m for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert applied["converted_linears"] == len(swapped) == predicted["weights"] == 4 * cfg.model.num_layers
    assert predicted["elements"] == sum(m.weight.numel() for m in swapped.values())
    assert not any("lm_head" in n or "mlp" in n for n in swapped)
    assert predicted["block_elements"] == predicted["elements"] // cfg.model.num_layers


def test_fsdp2_gathers_tensorwise_float8_weights_in_half_the_bytes_and_all_reduces_their_scales():
    """Under FSDP2 with tensorwise scales, a block's converted weights travel in 1 byte instead of bf16's 2, and
    one all-reduce a step carries an fp32 amax a weight; rowwise and DDP move what bf16 moves."""
    from harness.theory.communication import collectives
    from harness.theory.shape import shape_of

    def gathers(recipe: str, backend: str = "fsdp"):
        cfg = compose([*LLAMA_GPU, "parallelism.nproc_per_node=2", f"backend={backend}", f"train.float8={recipe}"])
        s = shape_of(cfg, 2, models.param_count(cfg.model))
        found = collectives(cfg.backend, s)
        return s, [c for c in found if c.op == "all_gather"], [c for c in found if c.op == "all_reduce"]

    s, bf16, reduces = gathers("none")
    _, tensorwise, tensorwise_reduces = gathers("tensorwise")
    _, rowwise, _ = gathers("rowwise")
    block = s.block_params
    assert s.float8_weights == 0
    f8 = shape_of(compose([*LLAMA_GPU, "backend=fsdp", "train.float8=tensorwise"]), 1,
                  models.param_count(compose(LLAMA_GPU).model))
    converted = f8.float8_block_elements
    assert 0 < converted < block and f8.float8_all_gather
    assert [c.size_bytes for c in bf16][0] == pytest.approx(2 * block, rel=0.01)
    assert [c.size_bytes for c in tensorwise][0] == pytest.approx(2 * (block - converted) + converted, rel=0.01)
    assert [c.size_bytes for c in rowwise] == [c.size_bytes for c in bf16]
    assert len(tensorwise_reduces) == len(reduces) + 1
    extra = [c for c in tensorwise_reduces if c.size_bytes == 4 * f8.float8_weights]
    assert extra and extra[0].count == 1
    assert not gathers("tensorwise", "ddp")[0].float8_all_gather


def test_gpu_axes_refuses_in_one_line_without_a_gpu_or_with_an_unknown_cell(capsys):
    import torch

    from harness.studies.gpu import axes as gpu_axes

    assert gpu_axes.main(["--cells", "fsdp,fsdp_fp4"]) == 2
    assert capsys.readouterr().err.strip().startswith("gpu-axes: unknown cell fsdp_fp4; use some of fsdp,")
    if not torch.cuda.is_available():
        assert gpu_axes.main([]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    # every cell is a config the rules accept on one CUDA device of compute capability 9.0 (float8 where
    # torchao is installed); DeepCompile and float8 are the GPU-only ones
    from importlib.util import find_spec

    for name, overrides in gpu_axes.CELLS.items():
        cfg = compose([*gpu_axes.COMMON, *overrides, "train.steps=20", "train.warmup_steps=5"])
        found = [p for p in rules.problems(cfg, cuda_devices=lambda: 1)
                 if not (p.startswith("train.float8") and not find_spec("torchao"))]
        found = [p for p in found if "sm" not in p.split(":")[1][:30]]  # this host's capability, not an H100's
        assert not found, (name, found)


def test_a_wrapper_subclass_weight_counts_the_bytes_of_its_inner_tensors():
    """The H100 run's float8 tensorwise cell failed at its first state count: torchao's float8 weight wrapper
    (FSDP2's float8 all-gather) stores nothing itself, and its placeholder storage's data_ptr raises. Its bytes
    are its inner tensors', each storage once, as torch's own wrapper subclass TwoTensor shows on CPU."""
    import torch
    from torch.testing._internal.two_tensor import TwoTensor

    from harness.runtime.strategies.base import storage_bytes

    a, b = torch.zeros(10), torch.zeros(10)
    wrapped = torch.nn.Parameter(TwoTensor(a, b))
    with pytest.raises(RuntimeError):
        wrapped.untyped_storage().data_ptr()
    assert storage_bytes([wrapped], set()) == 80
    assert storage_bytes([wrapped, a, b[2:]], set()) == 80  # a storage seen through the wrapper is not recounted


def test_deepcompile_has_its_op_built_first_dynamo_on_and_an_arch_list_deepspeed_can_parse(monkeypatch):
    """The H100 run's DeepCompile cell failed in DeepSpeed's op builder: the image's TORCH_CUDA_ARCH_LIST holds
    "9.0a", which DeepSpeed 0.19.8 cannot parse. Its ranks also started with dynamo disabled (an eager run's
    default), and the op would have been built inside the first step's setup."""
    from harness.backends.deepspeed.jit_ops import arch_list_deepspeed_reads
    from harness.config.derive import jit_ops
    from harness.launcher.torchrun import rank_env

    assert arch_list_deepspeed_reads("9.0a") == "9.0"
    assert arch_list_deepspeed_reads("8.0 9.0a;9.0a+PTX") == "8.0;9.0;9.0+PTX"
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    deepcompile = compose([*LLAMA_GPU, "backend=ds_zero3", "backend.deepcompile=true"])
    eager = compose([*LLAMA_GPU, "backend=ds_zero3"])
    assert jit_ops(deepcompile) == ["dc"] and jit_ops(eager) == []
    assert "TORCHDYNAMO_DISABLE" not in rank_env(deepcompile)
    assert rank_env(eager)["TORCHDYNAMO_DISABLE"] == "1"
    # make warm builds every op a family names: on CPU, DeepSpeed has no DeepCompile op, which is "not used by
    # this accelerator", not an error (a fresh clone's make warm stopped on it)
    import torch

    from harness.backends.deepspeed.jit_ops import load
    if not torch.cuda.is_available():
        assert load("dc") is False
