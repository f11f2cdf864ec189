"""The offline dashboard: summary.csv, report.md and a self-contained report.html that a real browser renders,
built from a real 8-backend sweep, and built all the same when runs died at any point."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BACKENDS, REPO
from harness.reporting import html_report as report
from harness.reporting import sweep_report as sweep
from harness.reporting import tables

pytestmark = pytest.mark.slow
ARTIFACTS = REPO / "tests" / "artifacts"


def sweep_dir(runs) -> Path:
    return next(iter(runs.values()))[2].parent


def test_summary_csv_has_a_row_per_run_with_status_and_figures(fp32_runs):
    rows = list(csv.DictReader(open(sweep_dir(fp32_runs) / "summary.csv")))
    assert sorted(r["backend"] for r in rows) == sorted(BACKENDS)
    for r in rows:
        assert r["status"] == "ok"
        assert float(r["throughput/tokens_per_s"]) > 0
        assert float(r["memory/model_states_predicted_bytes"]) > 0


def test_report_marks_the_best_figure_of_each_column(fp32_runs):
    md = (sweep_dir(fp32_runs) / "report.md").read_text()
    best_tokens = max(s["figures"]["throughput/tokens_per_s"] for s, _, _ in fp32_runs.values())
    assert f"**{best_tokens:,.0f}**" in md
    for plot in ("tradeoff", "bars", "loss_curves", "memory_predicted_vs_measured"):
        assert f"plots/{plot}.png" in md and (sweep_dir(fp32_runs) / "plots" / f"{plot}.png").stat().st_size > 5000
    assert "How each figure was measured" in md
    # the settings each backend really ran with, one row per run, read back from the frameworks
    settings = md.split("## Settings that ran", 1)[1].split("\n## ", 1)[0]
    assert settings.count("| parity |") == len(fp32_runs)
    assert "overlap_comm False" in settings and "root True" in settings and "bucket_cap" in settings


def test_report_html_renders_in_headless_chromium(fp32_runs):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is not installed: run `make browser` (apt-get install chromium), as `make test` does"
    page = sweep_dir(fp32_runs) / "report.html"
    assert "http://" not in page.read_text() and "https://" not in page.read_text()  # self-contained
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
             "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    # the page's own script marks each image the browser decoded (naturalWidth > 0) once it has loaded
    assert len(re.findall(r'data-rendered="yes"', dom)) == 6, dom[-2000:]  # time_breakdown among them
    assert 'data-broken="yes"' not in dom
    # one generated sentence per backend on where its step time goes, against the fastest
    story = dom.split('id="time-story"', 1)[1].split("</ul>", 1)[0]
    assert story.count("<li>") == len(BACKENDS) and story.count("the fastest") == 1, story
    summary, settings = dom.split('id="summary"', 1)[1].split('id="settings"', 1)
    assert summary.count("<tr>") == 2 + len(BACKENDS)  # headings, headers, and a row per backend
    # the columns sit under their headings: throughput, step time, peak, model states, ...
    spans = [int(n) for n in re.findall(r'<th colspan="(\d+)" scope="colgroup">', summary)]
    assert len(spans) == len(report.GROUPS) >= 5 and sum(spans) == summary.count('<th scope="col">')
    assert "peak of live tensors per rank" in summary and "model states per rank" in summary
    assert settings.count("<tr>") == 1 + len(BACKENDS)  # and the settings each ran with
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    subprocess.run([*flags, "--window-size=1400,2600", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 50_000  # a rendered page, not a blank one


def test_report_survives_runs_that_died_at_any_point(fp32_runs, tmp_path):
    src = sweep_dir(fp32_runs)
    dead = tmp_path / "damaged"
    top_level = {"plots", "report.md", "report.html", "summary.csv", "summary.md"}
    shutil.copytree(src, dead, ignore=lambda d, names: [n for n in names if Path(d) == src and n in top_level])
    runs = sorted(p for p in dead.iterdir() if p.is_dir() and (p / "summary.json").exists())
    (runs[0] / "summary.json").write_text('{"status": "ok", "figu')  # torn write (cannot happen, but still)
    (runs[1] / "metrics.jsonl").write_text((runs[1] / "metrics.jsonl").read_text()[:-40])  # killed mid-line
    (runs[2] / "summary.json").write_text('{"status": "oom", "reason": "rank 1 oom at step 3", "backend": "x"}')
    (runs[3] / "config.yaml").unlink()
    rows = sweep.build(dead)  # the tables, then report.md and report.html
    html = (dead / "report.html").read_text()
    statuses = sorted(r["status"] for r in rows)
    assert statuses.count("ok") == len(BACKENDS) - 2 and "oom" in statuses and "failed" in statuses
    assert "rank 1 oom at step 3" in html and "summary.json unreadable" in html


def test_report_on_a_dir_that_is_not_a_sweep_says_so_in_one_line(tmp_path, capsys):
    assert sweep.main([str(tmp_path / "no_such_sweep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardbench: no sweep dir") and "no_such_sweep" in err[0]
    assert sweep.main([str(tmp_path)]) == 2  # a dir, but no run in it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no run" in err[0]
    assert not list(tmp_path.iterdir())  # and nothing was written there


def test_the_end_of_a_run_or_sweep_says_where_its_offline_wandb_runs_are_and_how_to_upload_them(tmp_path):
    from harness.core.rundir import wandb_sync_hint

    assert wandb_sync_hint(tmp_path) is None  # nothing to upload: nothing said
    (tmp_path / "backend=ddp" / "wandb" / "offline-run-1").mkdir(parents=True)
    (tmp_path / "backend=fsdp" / "wandb" / "offline-run-2").mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-3").mkdir(parents=True)  # the sweep's summary run
    hint = wandb_sync_hint(tmp_path)
    assert hint.startswith(f"W&B: 3 offline runs under {tmp_path}, not uploaded; upload with: wandb sync ")
    assert f"{tmp_path}/wandb/offline-run-* {tmp_path}/*/wandb/offline-run-*" in hint
    single = wandb_sync_hint(tmp_path / "backend=ddp")
    assert single.endswith(f"wandb sync {tmp_path}/backend=ddp/wandb/offline-run-*") and "1 offline run " in single


def demo_rows() -> list:
    """The committed demo's eight rows (results/demo/summary.csv), as the sweep's collect gives them."""
    rows = []
    for r in csv.DictReader(open(REPO / "results" / "demo" / "summary.csv")):
        figures = {}
        for key, value in r.items():
            if "/" in key and value:
                try:
                    figures[key] = float(value)
                except ValueError:
                    pass
        rows.append({"backend": r["backend"], "model": r["model"], "precision": r["precision"],
                     "status": r["status"], "figures": figures, "config": {}})
    return rows


@pytest.mark.parametrize("width", [100, 200])
def test_the_terminal_table_fits_its_width_without_cutting_a_name_or_a_figure(width):
    from rich.console import Console

    rows = demo_rows()
    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(tables.console_table(rows, width))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
    assert all(f" {r['backend']} " in text for r in rows)  # every backend named whole: offload rows stand apart
    title = text.strip().splitlines()[0]
    assert f"tiny_llama, fp32, all {len(rows)} ok" in title  # the columns that never change, said once
    assert "peak" in text and "predicted" in text and "tokens/s" in text
    if width == 200:  # every column
        assert "left out" not in text and "error %" in text and "host RSS" in text
    else:
        assert "left out at 100 columns: host RSS MiB" in " ".join(text.split())


@pytest.mark.parametrize("method", ["categorised, lenient", "allocations"])
def test_memory_notes_speak_to_the_user_and_leave_torchs_assertion_to_the_log(method):
    from types import SimpleNamespace

    from harness.reporting.run_summary import memory_notes

    rank = SimpleNamespace(tensor_peak={"method": method, "why": "AssertionError: version mismatch at node 42"})
    (note,) = memory_notes({}, [rank], {})
    assert "AssertionError" not in note and "version mismatch" not in note, note
    assert "the peak is exact" in note and "launcher.log" in note


def test_a_prediction_that_misses_by_more_than_30_percent_is_marked_not_headlined():
    """The CPU time model predicted ds_zero3's step at 4.7 ms beside 25.9 measured: that cell is greyed with a
    dagger and a legend, never highlighted as a figure; a prediction within 30% is an ordinary cell."""
    rows = [{"backend": b, "model": "tiny_llama", "precision": "fp32", "status": "ok", "config": {},
             "figures": {"time/step_predicted_s": 0.0047, "time/step_error_pct": err, "loss/final_loss": 3.0}}
            for b, err in (("ds_zero3", 451.1), ("ddp", 12.0))]
    table = report.Table(rows, ["backend.name"])
    column = table.headers.index("step time: predicted ms")
    assert [cells[column] for cells in table.body] == [("4.7", "miss"), ("4.7", "")]
    md = report.markdown("t", "", table, {})
    assert "| 4.7 † |" in md and report.MISS_LEGEND in md
    page = report.page("t", "", table, {})
    assert 'class="miss" title="off by more than 30% from the measurement">4.7 †' in page


def test_where_the_memory_goes_names_what_fills_the_peak():
    """The demo's ZeRO-2 under DeepSpeed's own defaults: a 1,910 MiB peak of which 1,907 MiB is the reduce bucket
    (5e8 fp32 elements): its sentence and its run line say so; DDP's peak is its own states and activations,
    about which the run line says nothing more."""
    from harness.reporting import memory_story

    bucket, states, acts = 5e8 * 4, 1.5 * 2**20, 1.2 * 2**20
    zero2 = {"memory/peak_mem_bytes": bucket + states + acts, "memory/tensor_peak_predicted_bytes": bucket + states + acts,
             "memory/peak_at_block_backward_predicted_bytes": bucket + states + acts,
             "memory/peak_at_step_predicted_bytes": states * 2, "memory/model_states_device_predicted_bytes": states,
             "memory/block_backward_reduce_bucket_predicted_bytes": bucket,
             "memory/block_backward_activations_predicted_bytes": acts}
    line = memory_story.sentence("ds_zero2", zero2)
    assert line.startswith("ds_zero2: 1,910.0 MiB at its peak (inside the backward), of which 1,907.3 MiB DeepSpeed's "
                           "reduce bucket"), line
    assert "then 1.5 MiB model states, then 1.2 MiB activations saved for backward" in line
    assert memory_story.dominant_overhead(zero2).startswith("1,907.3 MiB of it DeepSpeed's reduce bucket")
    ddp = {**zero2, "memory/peak_mem_bytes": states + acts, "memory/tensor_peak_predicted_bytes": states + acts,
           "memory/peak_at_block_backward_predicted_bytes": states + acts,
           "memory/block_backward_reduce_bucket_predicted_bytes": 0}
    assert memory_story.dominant_overhead(ddp) is None
    table = report.Table([{"backend": "ds_zero2", "status": "ok", "figures": zero2, "config": {}}], ["backend.name"])
    assert "## Where the memory goes" in report.markdown("t", "", table, {})
    assert 'id="memory-story"' in report.page("t", "", table, {})


def test_every_plot_has_a_caption_that_says_what_it_shows():
    from harness.reporting.plots import CAPTIONS, caption

    made = {"tradeoff", "bars", "memory_predicted_vs_measured", "peak_by_kind", "time_breakdown", "loss_curves",
            "sequence_scaling"}
    assert set(CAPTIONS) == made
    assert all(len(caption(stem).split()) >= 6 for stem in made)  # a sentence, not a file name


def rendered(monkeypatch):
    """Every figure the plots save, drawn and kept open for the test to read."""
    from harness.reporting import plots

    figures = {}
    real_save = plots._save

    def keep(fig, path):
        fig.canvas.draw()
        figures[Path(path).stem] = fig
        fig.savefig(path)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    return figures, real_save


def overlapping_texts(fig) -> list:
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t.figure is fig]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:]
            if box_a.overlaps(box_b) and box_a.width * box_a.height > 0 and box_b.width * box_b.height > 0]


def test_the_demo_plots_share_one_axis_one_colour_per_kind_and_no_label_collides(tmp_path, monkeypatch):
    from harness.reporting import plots

    clash = plots.pyplot().figure()
    clash.text(0.5, 0.5, "ds_zero3"), clash.text(0.51, 0.5, "ds_zero3_offload")
    clash.canvas.draw()
    assert len(overlapping_texts(clash)) == 1  # the check sees a collision
    plots.pyplot().close(clash)
    figures, _ = rendered(monkeypatch)
    ok = [(r, r["backend"]) for r in demo_rows()]
    plots.tradeoff(ok, tmp_path)
    plots.peak_by_kind(ok, tmp_path)
    for stem, fig in figures.items():
        assert overlapping_texts(fig) == [], stem
    panels = [ax for ax in figures["peak_by_kind"].axes if ax.get_visible()]
    assert len(panels) == len(ok) and len({ax.get_xlim() for ax in panels}) == 1  # one axis for every run
    assert panels[0].get_xscale() == "log"  # 0.2 MiB of grads beside ZeRO-2's 1,907 MiB bucket
    for ax in panels:  # a measured bar and its predicted bar per kind, in the kind's one colour
        bars = ax.patches
        assert all(bars[i].get_facecolor()[:3] == bars[i + 1].get_facecolor()[:3] for i in range(0, len(bars), 2))
        assert len({bars[i].get_facecolor()[:3] for i in range(0, len(bars), 2)}) == len(plots.KINDS) + 1
    for fig in figures.values():
        plots.pyplot().close(fig)


def test_a_sweep_over_the_sequence_plots_a_line_per_method_against_it(tmp_path, monkeypatch):
    """experiments/long_context: tokens/s and peak per rank against the sequence, the ring's and Ulysses' runs
    each one line over their sequences; a sweep at one sequence draws no such plot."""
    from harness.reporting import plots

    figures, _ = rendered(monkeypatch)

    def run(backend: str, mesh: str, seq: int) -> tuple:
        figures_ = {"throughput/tokens_per_s": 1000.0 / seq, "memory/peak_mem_bytes": seq * 2**20}
        return {"backend": backend, "mesh": mesh, "config": {"parallelism.seq_len": seq}, "figures": figures_}, backend

    ok = [run(b, m, seq) for b, m in (("fsdp", "dp 2 x cp 2 (ring)"), ("ds_zero2", "dp 2 x cp 2 (Ulysses)"))
          for seq in (1024, 256, 512)]
    assert plots.sequence_scaling(ok[:1], tmp_path) is None
    assert plots.sequence_scaling(ok, tmp_path).name == "sequence_scaling.png"
    throughput, memory = figures["sequence_scaling"].axes
    assert sorted(line.get_label() for line in memory.get_lines()) == ["ds_zero2, dp 2 x cp 2 (Ulysses)",
                                                                      "fsdp, dp 2 x cp 2 (ring)"]
    for line in throughput.get_lines():  # each line runs along the sequence, in order
        assert list(line.get_xdata()) == [256, 512, 1024]
    plots.pyplot().close(figures["sequence_scaling"])


def test_the_table_names_what_the_sweep_varies_and_orders_its_numbers_as_numbers(tmp_path):
    """Two runs of one backend at two sequences are two rows told apart by a seq_len column, 256 before 1024."""
    from harness.reporting.collect import collect
    from harness.reporting.tables import write_tables

    for seq in (1024, 256):
        run = tmp_path / f"backend=fsdp,parallelism.seq_len={seq}"
        run.mkdir()
        (run / "config.yaml").write_text(f"backend:\n  name: fsdp\nparallelism:\n  seq_len: {seq}\n")
        (run / "summary.json").write_text(json.dumps({"status": "ok", "backend": "fsdp", "model": "tiny_llama",
                                                      "figures": {"throughput/tokens_per_s": seq}}))
    md = write_tables(tmp_path, collect(tmp_path)).splitlines()
    assert md[0].startswith("| backend | seq_len | model |")
    assert [line.split(" | ")[1] for line in md[2:4]] == ["256", "1024"]


def test_the_loss_plot_shows_each_run_as_its_difference_from_the_baseline(tmp_path, monkeypatch):
    from harness.core.rundir import write_text
    from harness.reporting import plots

    figures, _ = rendered(monkeypatch)
    losses = {"ddp": [5.0, 4.0, 3.0], "fsdp": [5.0, 4.0, 3.0], "ds_zero3": [5.0, 4.5, 3.25]}
    rows = []
    for backend, curve in losses.items():
        write_text(tmp_path / backend / "metrics.jsonl",
                   "".join(f'{{"step": {i}, "loss/loss": {v}}}\n' for i, v in enumerate(curve)))
        # not ok: only the loss plot, which draws every run that logged a loss, has anything to draw
        rows.append({"backend": backend, "run_dir": backend, "status": "failed", "figures": {}, "config": {}})
    plots.all_plots(list(reversed(rows)), [r["backend"] for r in reversed(rows)], tmp_path, tmp_path / "plots")
    left, right = figures["loss_curves"].axes
    assert "ddp" in left.get_title()  # the baseline, though it came last
    diffs = {line.get_label(): list(line.get_ydata()) for line in right.get_lines() if not line.get_label().startswith("_")}
    assert diffs == {"ds_zero3": [0.0, 0.5, 0.25], "fsdp": [0.0, 0.0, 0.0]}
    for fig in figures.values():
        plots.pyplot().close(fig)


def test_the_verdict_names_the_fastest_the_leanest_and_the_ties_inside_the_noise(tmp_path):
    """The demo's table ranked ds_zero1 ahead of ddp on a loaded machine and nothing said the gap was noise: the
    verdict bootstraps each run's median step from its timed steps and calls overlapping intervals a tie."""
    import json as json_

    from harness.reporting import verdict

    steps = {"ddp": [0.010, 0.011, 0.010, 0.012, 0.011, 0.010, 0.011, 0.010],  # ~10.5 ms
             "ds_zero1": [0.011, 0.010, 0.012, 0.011, 0.010, 0.011, 0.012, 0.011],  # overlaps ddp
             "ds_zero3": [0.030, 0.031, 0.029, 0.030, 0.032, 0.030, 0.031, 0.030]}  # clearly slower
    rows = []
    for backend, times in steps.items():
        (tmp_path / backend).mkdir()
        lines = [{"step": 0, "warmup": True, "throughput/step_time_s": 1.0}]  # warm-up: never counted
        lines += [{"step": i + 1, "warmup": False, "throughput/step_time_s": t} for i, t in enumerate(times)]
        (tmp_path / backend / "metrics.jsonl").write_text("\n".join(json_.dumps(m) for m in lines))
        rows.append({"backend": backend, "status": "ok", "run_dir": backend, "device": "cpu: AMD EPYC (2 cores)",
                     "config": {}, "figures": {"throughput/tokens_per_s": 1000 / sorted(times)[4],
                                               "memory/peak_mem_bytes": {"ddp": 4, "ds_zero1": 3, "ds_zero3": 2}[backend]
                                               * 2**20}})
    lines = verdict.sentences(rows, list(steps), lambda r: (), tmp_path)
    assert lines[0].startswith("Fastest: ddp, ") and "over its 8 timed steps" in lines[0], lines
    assert lines[1].startswith("Least memory: ds_zero3, 2.00 MiB") and "the most: ddp, 4.00 MiB" in lines[1]
    assert lines[2] == ("Inside the noise (their median steps' intervals overlap, so their order is not measured): "
                        "ddp and ds_zero1."), lines
    assert "within one launch" in lines[3] and "does not carry over to GPUs" in lines[4]
    low, high = verdict.median_interval(steps["ddp"])
    assert 0.010 <= low <= 0.0105 <= high <= 0.011
    assert verdict.median_interval(steps["ddp"][:4]) is None  # too few steps: no interval, and it says so


def test_user_supplied_strings_are_text_in_report_html_never_markup(tmp_path):
    """A sweep name, a run's label, a failure's reason and a note are the user's strings (or an exception's):
    report.html shows them as text. Checked in headless Chromium: the payloads never become elements, so their
    handlers never run."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is not installed: run `make browser`"
    payload = "<img src=x onerror=\"document.title='pwned'\">"
    rows = [{"backend": f"ddp{payload}", "status": "ok", "config": {}, "model": "m", "precision": "fp32",
             "figures": {"throughput/tokens_per_s": 1.0, "loss/final_loss": 3.0}},
            {"backend": "fsdp", "status": "failed", "reason": f"rank 0 failed: {payload}<script>document.title="
             "'pwned'</script>", "config": {}, "figures": {}, "errors": [payload]}]
    table = report.Table(rows, ["backend.name"])
    table.verdict = [f"Fastest: {payload}"]
    page = tmp_path / "report.html"
    page.write_text(report.page(f"sweep{payload}", f"context {payload}", table, {}))
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<title>shardbench: sweep&lt;img" in dom and "<title>pwned</title>" not in dom, dom[:600]
    assert "<img src=\"x\"" not in dom and "<img src=x" not in dom and "<script>document" not in dom
    assert dom.count("&lt;img src=x onerror=") >= 5  # each one shown, as text


def test_wandb_history_carries_no_key_of_the_runs_summary(fp32_runs):
    """W&B's runs table shows each summary key's last history row unless the summary set it last: a history that
    logs none of the summary's keys cannot replace the run's figures (issue 74: the last step's tokens/s did)."""
    from harness.core.rundir import RunDir
    from harness.runtime.sink import history_row

    for summary, records, run_dir in fp32_runs.values():
        history = {k for record in RunDir(run_dir).read_metrics() for k in history_row(record)}
        assert history and "step/tokens_per_s" in history, run_dir
        assert history.isdisjoint(summary["figures"]), sorted(history & set(summary["figures"]))


def test_a_sweeps_offline_wandb_runs_read_back_with_the_reports_figures(resumed_runs):
    """What W&B's runs table will show once `wandb sync` uploads a sweep: each offline run's summary, replayed
    from its .wandb file, holds every figure of the run's summary.json, equal; the per-step rate keeps its own
    key; the run sits in the sweep's group as a `train` job (the dashboard's filter)."""
    from conftest import WANDB_BACKENDS
    from harness.reporting import wandb_offline

    for backend in WANDB_BACKENDS:
        summary, records, run_dir = resumed_runs[backend]
        assert summary["status"] == "ok" and len(summary["figures"]) > 50, (backend, summary.get("reason"))
        path = wandb_offline.run_file(run_dir)
        shown = wandb_offline.summary(path)
        differ = {k: (v, shown.get(k, "missing")) for k, v in summary["figures"].items() if shown.get(k, "missing") != v}
        assert not differ, (backend, dict(list(differ.items())[:5]))
        assert shown["step/tokens_per_s"] == records[-1]["throughput/tokens_per_s"]  # the last step, under its key
        meta = wandb_offline.run_metadata(path)
        assert (meta["group"], meta["job_type"]) == ("resumed", "train") and backend in meta["tags"], meta


def test_a_sweeps_dashboard_spec_builds_a_valid_wandb_report_and_workspace(fp32_runs):
    """Every sweep report writes dashboard.json: what `shardbench dashboard` (or the sweep's end, online) creates
    in W&B. Built here offline into wandb-workspaces' own Report and Workspace, whose pydantic models validate
    every panel and the run filter, and the workspace into the internal view W&B stores. Each chart reads a key
    the sweep's runs logged: a bar a summary figure, a curve a history key."""
    import json

    from harness.reporting import dashboard
    from harness.runtime.sink import history_row

    spec = json.loads((sweep_dir(fp32_runs) / dashboard.SPEC_FILE).read_text())
    assert spec["group"] == "fp32" and spec["verdict"] and spec["verdict"][0].startswith("Fastest")
    figures = {k for s, _, _ in fp32_runs.values() for k in s["figures"]}
    history = {k for _, records, _ in fp32_runs.values() for r in records for k in history_row(r)}
    drawn = [k for bar in spec["bars"] for k in bar["metrics"]]
    assert {"throughput/tokens_per_s", "flops/mfu_pct", "memory/device_peak_bytes_max",
            "memory/device_peak_predicted_bytes", "comm/measured_intra_node_bytes_per_step"} <= set(drawn)
    assert set(drawn) <= figures and {line["metric"] for line in spec["lines"]} <= history
    report, workspace = dashboard.views(spec, entity="team")
    grid = report.blocks[-1]
    assert len(grid.panels) == len(spec["bars"]) + len(spec["lines"]) + 1 and "'fp32'" in grid.runsets[0].filters
    view = dashboard.workspace_view(workspace)
    sections = view["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == ["Verdict", "Side by side", "Curves", "Settings that differ"]
    assert sum(len(s["panels"]) for s in sections) == len(spec["bars"]) + len(spec["lines"]) + 2
    filters = json.dumps(view["spec"]["section"]["runSets"][0]["filters"])
    assert "fp32" in filters and "jobType" in filters, filters


def test_a_runs_console_line_shows_its_peak_beside_the_theorys(fp32_runs):
    """The line a run ends with: the measured peak, the predicted one and the gap, as report.md has them."""
    from harness.core.records import one_line

    summary, _, run_dir = fp32_runs["fsdp"]
    f = summary["figures"]
    line = one_line(summary, run_dir)
    gap = 100 * (f["memory/peak_mem_bytes"] / f["memory/device_peak_predicted_bytes"] - 1)
    assert (f"peak {f['memory/peak_mem_bytes'] / 2**20:,.2f} MiB (predicted "
            f"{f['memory/device_peak_predicted_bytes'] / 2**20:,.2f} MiB, {gap:+.1f}%)") in line, line


def test_the_console_line_sets_the_peak_beside_the_theory_of_the_same_peak(tmp_path):
    """On CPU the peak is every live tensor's, offloaded states included: beside it the theory's tensor peak, not
    its device share (fsdp_offload read +62.5% against the device share in a fresh clone's demo); on CUDA the
    allocator's peak beside the device's prediction."""
    from harness.core.records import one_line

    figures = {"loss/final_loss": 3.19, "throughput/tokens_per_s": 4000.0, "throughput/step_time_p50_s": 0.06,
               "memory/peak_mem_bytes": 2.94 * 2**20, "memory/tensor_peak_predicted_bytes": 2.77 * 2**20,
               "memory/device_peak_predicted_bytes": 1.81 * 2**20}
    summary = {"status": "ok", "backend": "fsdp_offload", "model": "tiny_llama", "world_size": 2,
               "precision": "fp32", "figures": figures}
    assert "(predicted 2.77 MiB, +6.1%)" in one_line(summary, tmp_path)
    figures["memory/peak_allocated_bytes_max"] = figures["memory/peak_mem_bytes"]
    assert "(predicted 1.81 MiB, +62.4%)" in one_line(summary, tmp_path)
