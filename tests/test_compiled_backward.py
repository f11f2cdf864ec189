"""What a compiled block's backward holds at its peak, walked from inductor's generated wrapper
(runtime/compiled_backward.py): inputs until their `del`, buffers from allocation to `del`, a buffer handed on
keeps its one storage, a fallback kernel's results are held from the line that takes each out. In process, on a
wrapper written here in the form inductor generates (the real one is generated for the drill's compiled cells,
tests/test_compile.py, and the memory check's)."""
from __future__ import annotations

from harness.runtime.compiled_backward import wrapper_peak

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
    # runtime/trace_cache.on_disk: what one process traced, the next reads instead of tracing again; a trace that
    # found nothing (None: the generated code could not be read) is not kept, so the next process tries again
    from harness.runtime import trace_cache

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
