"""The advisor's CPU plan replays only what can rank (studies/advise/step_times.bounded_by_twin): a candidate with
a twin that fits doing no more work (no checkpointing, a micro-batch as large or larger, on the same backend, mesh
and method) is not replayed, its step at least the twin's. The bound is held here by replaying both, and the
plan's ranking (the pick, the runner-up, the frontier, each kind's sentence) is held to leave the bounded ones
out."""
from __future__ import annotations

from forked_ranks import ForkedPopen
from harness.studies.advise.search import Candidate, Plan


def _candidate(backend, mb, policy, fits=True, tp=1, step=1.0, peak=100, sync=""):
    return Candidate(backend, mb, 4 // (mb * 2 // tp), policy != "none", [], axes={"tp": tp}, policy=policy,
                     fits=fits, predicted_step_s=step, predicted_tokens_per_s=1 / step, predicted_peak_bytes=peak,
                     kind="split" if tp > 1 else "dp only", grad_sync=sync)


def _bounded(*candidates):
    from harness.studies.advise.step_times import bounded_by_twin

    plan = Plan([], 10**9, 0.1, 4, 2, "tiny_llama", "fp32", "cpu", "native", candidates=list(candidates))
    return bounded_by_twin(plan, [c.name for c in plan.candidates if c.fits])


def test_a_candidate_is_bounded_by_a_twin_doing_no_more_work_only_where_that_twin_fits():
    off, full, every = (_candidate("ddp", 2, p) for p in ("none", "full", "every_2"))
    unfit_off, needs_full = _candidate("ddp", 1, "none", fits=False), _candidate("ddp", 1, "full")
    other_mesh = _candidate("ddp", 2, "full", tp=2)  # another mesh: ddp-mb2-ckptoff is not its twin
    other_backend = _candidate("fsdp", 2, "full")
    # checkpointing at the same micro-batch, and a smaller micro-batch checkpointed or not, are bounded by the
    # larger micro-batch without checkpointing
    assert _bounded(off, full, every, unfit_off, needs_full, other_mesh, other_backend) == {
        full.name: off.name, every.name: off.name, needs_full.name: off.name}
    smaller = _candidate("ddp", 1, "none")
    assert _bounded(off, smaller, needs_full) == {smaller.name: off.name, needs_full.name: off.name}
    # where the larger one does not fit, the smaller one is replayed and bounds its own checkpointed twin
    unfit_large = _candidate("ddp", 2, "none", fits=False)
    assert _bounded(unfit_large, smaller, needs_full) == {needs_full.name: smaller.name}
    # a larger micro-batch on another mesh or backend bounds nothing
    assert _bounded(_candidate("ddp", 2, "none", tp=2), smaller, _candidate("fsdp", 2, "none")) == {}


def test_reducing_every_micro_batch_is_bounded_by_the_larger_micro_batch_and_not_by_its_deferred_twin():
    """A `-syncevery` candidate (FSDP2 reducing each micro-batch) is priced from its deferred twin's work plus
    its extra reductions (step_times.twin_work), not bounded by it; a larger micro-batch bounds both."""
    deferred, every = _candidate("fsdp", 1, "none"), _candidate("fsdp", 1, "none", sync="every")
    every_full = _candidate("fsdp", 1, "full", sync="every")
    assert _bounded(deferred, every, every_full) == {every_full.name: every.name}  # its own way of reducing first
    large = _candidate("fsdp", 2, "none")
    assert _bounded(large, deferred, every, every_full) == {
        deferred.name: large.name, every.name: large.name, every_full.name: large.name}
    # a larger micro-batch reducing each of its 2 can reduce more often than a deferred smaller one: no bound
    tp_every, tp_deferred = _candidate("fsdp", 2, "none", tp=2, sync="every"), _candidate("fsdp", 1, "none", tp=2)
    assert _bounded(tp_every, tp_deferred) == {}


def committed_cpu_costs(cfg):
    """results/device_costs/cpu.json's costs whatever CPU this is (load_device_costs refuses another machine's)."""
    import json
    from pathlib import Path

    from harness.reporting.time_and_comm import collectives_table, device_costs

    record = json.loads((Path(__file__).parent.parent / "results" / "device_costs" / "cpu.json").read_text())
    return device_costs(record, tight=collectives_table(cfg))


def test_the_bound_holds_where_replayed_and_the_ranking_leaves_the_bounded_out(tmp_path):
    """Replayed on tiny_llama at 2 ranks and priced at this machine's committed costs, each checkpointing policy
    steps slower than its twin without (DDP, FSDP2 and ZeRO-3, whose recomputation re-gathers the parameters), and
    so does micro-batch 1 (grad_accum 2) against micro-batch 2: the 165 checkpointed candidates of the default
    plan, all replayed, ran 1.06x to 1.80x their twin's step; its 40 at a smaller micro-batch, 1.31x to 4.16x."""
    from harness.config.compose import compose
    from harness.launcher.replays import replay_work
    from harness.reporting.time_and_comm import load_device_costs
    from harness.runtime import model_counts
    from harness.studies.advise import frontier, kinds
    from harness.studies.advise.answer import predicted_choice
    from harness.theory.op_costs import predict_counted
    from harness.theory.shape import shape_of

    from harness.config.recompute import overrides

    configs = {}
    for backend in ("ddp", "fsdp", "ds_zero3"):
        for policy in ("none", "full", "every_2"):
            configs[f"{backend}-{policy}"] = compose([
                "model=tiny_llama", f"backend={backend}", "parallelism.micro_batch=2", "parallelism.grad_accum=1",
                "train.steps=2", "train.warmup_steps=1", "logger=none", *overrides(policy)])
        configs[f"{backend}-mb1"] = compose([
            "model=tiny_llama", f"backend={backend}", "parallelism.micro_batch=1", "parallelism.grad_accum=2",
            "train.steps=2", "train.warmup_steps=1", "logger=none"])
    replayed = replay_work(configs, tmp_path, jobs=1, popen=ForkedPopen)
    steps = {}
    for name, cfg in configs.items():
        assert replayed[name]["ok"], replayed[name].get("traceback")
        costs, why = load_device_costs(cfg)
        if costs is None:  # another CPU than the committed costs' (this project's machines vary): their rates
            costs = committed_cpu_costs(cfg)  # price more work as more time all the same, which is the claim
        shape = shape_of(cfg, 2, model_counts.param_count(cfg.model, cfg.workload))
        steps[name] = predict_counted(cfg.backend, shape, replayed[name]["work"], costs)["step"]
    for backend in ("ddp", "fsdp", "ds_zero3"):
        twin = steps[f"{backend}-none"]
        assert steps[f"{backend}-full"] > twin and steps[f"{backend}-every_2"] > twin, (backend, steps)
        assert steps[f"{backend}-mb1"] > twin, (backend, steps)

    # the plan: the bounded candidate carries its twin's step, and no ranking names it
    off, full = _candidate("ddp", 2, "none", step=0.011, peak=300), _candidate("ddp", 2, "full", step=0.011, peak=200)
    full.step_from = off.name
    slower = _candidate("fsdp", 2, "none", step=0.020, peak=250)
    plan = Plan([], 10**9, 0.1, 4, 2, "tiny_llama", "fp32", "cpu", "native", candidates=[off, full, slower])
    assert plan.priced == [off, slower] and plan.fitting == [off, full, slower]
    assert frontier.frontier(plan) == [slower, off]  # the bounded one's lower peak is no point of the frontier
    below = [line for line in frontier.lines(plan) if "lower, not priced" in line]  # but it is said to be there
    assert len(below) == 1 and below[0].startswith(f"  lower, not priced: {full.name} (dp) peaks at 0.0 MiB"), below
    choice = predicted_choice(plan)
    assert choice.startswith("Predicted best: ddp with micro-batch 2") and "Runner-up: fsdp" in choice
    said = "\n".join(kinds.sentences(plan, None))
    assert full.name not in said and f"its next, {slower.name}" in said
