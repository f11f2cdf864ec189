"""What a compiled block's backward holds at its peak, walked from inductor's generated wrapper
(runtime/compiled/compiled_backward.py): inputs until their `del`, buffers from allocation to `del`, a buffer handed on
keeps its one storage, a fallback kernel's results are held from the line that takes each out. In process, on a
wrapper written here in the form inductor generates (the real one is generated for the drill's compiled cells,
tests/test_compile.py, and the memory check's)."""
from __future__ import annotations

from harness.runtime.compiled.compiled_backward import wrapper_peak

MIB = 2**20

WRAPPER = '''
class Runner:
    def call(self, args):
        primals_1, saved_1, tangents_1 = args
        args.clear()
        assert_size_stride(primals_1, (64, 64), (64, 1), 'input')
        buf0 = empty_strided_cpu((1024, 256), (256, 1), torch.float32)
        extern_kernels.mm(saved_1, primals_1, out=buf0)
        buf1 = empty_strided_cpu((1024, 512), (512, 1), torch.bfloat16)
        cpp_fused_0(buf0, buf1)
        del saved_1
        buf2 = reinterpret_tensor(buf0, (256, 1024), (1024, 1), 0); del buf0  # reuse
        buf3 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(buf2, buf1)
        buf4 = buf3[0]
        assert_size_stride(buf4, (4, 4, 256, 64), (65536, 16384, 64, 1), 'fallback')
        del buf3
        buf5 = buf1; del buf1  # reuse
        del tangents_1
        del buf4
        return (buf5, buf2, )


def get_args():
    pass
'''


def test_the_walk_holds_each_storage_once_from_its_allocation_to_its_del():
    # inputs: the parameter 0 bytes (the caller's mark: a model state, counted once with the states), the saved
    # tensor 1 MiB, the incoming gradient 2 MiB
    inputs = [0, 1 * MIB, 2 * MIB]
    # buf0 1 MiB and buf1 1 MiB (bf16) with both inputs: 5 MiB; the saved tensor is freed (4), buf0 handed on to
    # buf2 (still 4); the fallback's result taken out, 4 x 4 x 256 x 64 elements of 2 bytes = 0.5 MiB: 4.5 MiB
    assert wrapper_peak(WRAPPER, inputs, element_bytes=2) == 5 * MIB
    # with a 4 MiB result taken out the peak is that moment's: 4 + 4 MiB (element_bytes 16 only to move the peak)
    assert wrapper_peak(WRAPPER, inputs, element_bytes=16) == 8 * MIB


def test_a_wrapper_it_cannot_read_is_an_error_not_a_figure():
    import pytest

    with pytest.raises(ValueError):
        wrapper_peak("def something_else(): pass", [], element_bytes=4)


def test_a_trace_is_read_back_from_disk_and_a_failed_one_is_tried_again(tmp_path, monkeypatch):
    # runtime/compiled/trace_cache.on_disk: what one process traced, the next reads instead of tracing again; a trace
    # that found nothing (None: the generated code could not be read) is not kept, so the next process tries again
    from harness.runtime.compiled import trace_cache

    monkeypatch.setattr(trace_cache, "traces_dir", lambda: tmp_path)
    calls = []

    def traced(*args):
        calls.append(args)
        return None if args[0] == "fails" else {"per_token": 2.0}

    def process():  # a new process: the same code, its own in-memory cache
        def trace(name: str, tokens: int):
            return traced(name, tokens)
        return trace_cache.on_disk(__file__)(trace)

    assert process()("reads", 8) == {"per_token": 2.0} and process()("reads", 8) == {"per_token": 2.0}
    assert process()("fails", 8) is None and process()("fails", 8) is None
    assert calls == [("reads", 8), ("fails", 8), ("fails", 8)]
    assert len(list(tmp_path.glob("*.json"))) == 1


VIEWS = '''
def call(args):
    primals_1, q, k, v, tangents_1 = args
    args.clear()
    buf0 = empty_strided_cpu((1024, 256), (256, 1), torch.float32)
    del q
    del k
    buf1 = reinterpret_tensor(buf0, (256, 1024), (1024, 1), 0)
    del buf0
    del v
    buf2 = empty_strided_cpu((1024, 256), (256, 1), torch.float32)
    del buf1
    return (buf2, )
'''


def test_views_of_one_storage_hold_it_once_until_the_last_of_them_goes():
    # q, k and v are views of one 3 MiB projection (GPT-2 splits its fused q|k|v): held once, not three times,
    # and until v, the last of them, is deleted; buf1 is a view of buf0 that outlives buf0's name
    inputs, storages = [0, 3 * MIB, 3 * MIB, 3 * MIB, 2 * MIB], [None, "qkv", "qkv", "qkv", "tangent"]
    # the qkv storage and the gradient (5 MiB), with buf0 (6); q and k deleted, buf1 holds buf0's storage: still 6;
    # v deleted (3); buf2 while buf1 is alive: 4; buf1 deleted: 3
    assert wrapper_peak(VIEWS, inputs, element_bytes=4, input_storages=storages) == 6 * MIB
    # each its own storage, as the walk counted before: 3 x 3 + 2 + 1
    assert wrapper_peak(VIEWS, inputs, element_bytes=4) == 12 * MIB


def test_a_backward_input_is_a_parameter_by_the_forward_input_it_came_in_as():
    from harness.runtime.compiled.compiled_backward import _is_parameter

    parameter = [False, True, True]  # the compiled graph's inputs: the ids, then two weights
    assert [_is_parameter(n, parameter) for n in ("primals_1", "primals_2", "primals_3")] == [False, True, True]
    # a value the forward kept, the incoming gradient, an input past the forward's: never a parameter
    assert not any(_is_parameter(n, parameter) for n in ("add_11", "tangents_1", "primals_9"))


def _parts(overrides, compiled):
    from harness.config.compose import compose
    from harness.config.recompute import recompute_of
    from harness.runtime import models
    from harness.theory import activations
    from harness.theory.shape import shape_of

    cfg = compose(["model=tiny_llama", "model.num_layers=4", "parallelism.seq_len=512", "parallelism.micro_batch=4",
                   "train.compile=true", *overrides])
    counts = {**models.param_count(cfg.model, cfg.workload), **({"compiled_kept": compiled} if compiled else {})}
    s = shape_of(cfg, 2, counts)
    reg = activations.regime(cfg.backend, cfg.train.precision, cfg.train.master_weights)
    return cfg, s, activations.parts(cfg.model, cfg.parallelism, reg, recompute_of(cfg), s.matmul_weights,
                                     s.head_matmul_weights, s.mesh, compiled=compiled)


def test_a_whole_compiled_module_is_its_one_backward_read_and_keeps_what_that_backward_is_handed():
    # ZeRO-1/2's engine compiles the whole module: its one generated backward holds every activation alive then,
    # and is handed what the compiled forward kept; no gradient hook runs inside it, so no reduce bucket yet
    from harness.config import families
    from harness.theory import activations

    traced = {"per_token": 100.0, "per_block": 0.0, "outside": {"per_token": 10.0, "per_block": 0.0}}
    compiled = {"plain": traced, "checkpointed": traced, "module_backward_peak": 9 * MIB, "module_kept": 3 * MIB}
    cfg, s, a = _parts(["backend=ds_zero2", "train.activation_checkpointing=full"], compiled)
    assert {activations.in_block(a, k) for k in range(4)} == {9 * MIB}
    assert activations.saved(a) == 3 * MIB + a["log_softmax"] and activations.forward_end(a) == 3 * MIB
    family = families.of(cfg.backend)
    assert s.one_graph_backward and "reduce_bucket" not in family.phase_terms(cfg.backend, s, "block_backward", 3)
    cfg, eager, _ = _parts(["backend=ds_zero2", "train.activation_checkpointing=full", "train.compile=false"], None)
    assert family.phase_terms(cfg.backend, eager, "block_backward", 3)["reduce_bucket"] > 0  # hooks, block by block


def test_a_split_module_recomputes_a_checkpointed_block_eagerly_with_the_mask_the_compiled_module_built():
    # ZeRO-3's module, split at every submodule, breaks its graph inside the checkpoint: the block recomputes as
    # eager does, handed an explicit causal mask. tiny_llama fp32, 4 x 512 tokens: SDPA keeps the mask as fp32,
    # 4 x 512 x 512 x 4 bytes (4 MiB), GQA's k and v repeated to every head (+2 x 2048 tokens x 32 x 4 bytes,
    # 0.5 MiB), the boolean mask one byte an element (1 MiB): 5.5 MiB, what results/memory_check/compiled measured
    # over eager's run (24.029 against 18.529 MiB)
    from harness.theory import activations

    _, _, eager = _parts(["backend=ds_zero3", "train.activation_checkpointing=full", "train.compile=false"], None)
    kept = {"per_token": 4.0 * 64, "per_block": 0.0}  # a checkpointed block's input, as eager's
    traced = {"per_token": 1000.0, "per_block": 0.0, "outside": {"per_token": 10.0, "per_block": 0.0}}
    split = {"plain": traced, "checkpointed": kept, "eager_recompute": True}
    _, _, a = _parts(["backend=ds_zero3", "train.activation_checkpointing=full"], split)
    assert a["masked_attention"] == {"per_block": 4.5 * MIB, "shared": 1.0 * MIB}
    assert activations.in_block(a, 3) - activations.in_block(eager, 3) == 5.5 * MIB


def test_a_deep_module_s_backward_is_generated_at_two_depths_and_each_further_block_adds_the_same(monkeypatch):
    # generating llama_7b's 32 blocks took 51 s, its 3 and 4 blocks 18 s, and they gave the same peak (33.047 GiB);
    # every_k's blocks differ, so its module is generated at the run's own depth
    from omegaconf import OmegaConf

    from harness.config.compose import compose
    from harness.runtime.compiled import compiled_backward

    asked = []

    def generated(model_yaml, regime, policy, every, sequences, positions):
        depth = OmegaConf.create(model_yaml).num_layers
        asked.append((depth, policy))
        return {"peak": 10.0 + 3.0 * depth, "kept": 1.0 + 2.0 * depth}

    monkeypatch.setattr(compiled_backward, "_module_backward_peak", generated)
    deep = ["model=tiny_llama", "model.num_layers=32", "backend=ds_zero2", "train.compile=true"]
    walked = compiled_backward.module_backward_peak(compose([*deep, "train.activation_checkpointing=full"]), "fp32")
    assert asked == [(3, "full"), (4, "full")] and walked == {"peak": 10.0 + 3.0 * 32, "kept": 1.0 + 2.0 * 32}
    asked.clear()
    compiled_backward.module_backward_peak(compose([*deep, "train.activation_checkpointing=every_2"]), "fp32")
    assert asked == [(32, "every_k")]
