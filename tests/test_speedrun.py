"""The speedrun's pieces: the time budget (on a fake clock), the schedules planned by progress, the FLOP count
and the profile, and the experiments' pipelines (--quick); the slow test runs the recipe on a 1-minute budget."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from numformer.config import apply_overrides, load_config
from numformer.models import GPT
from numformer.models.flops import forward_flops_per_token, training_flops_per_token
from numformer.optim import Schedule, make_schedule
from numformer.train import Trainer
from numformer.train.budget import Budget

from conftest import src_env

REPO_ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, "positional": "rope", "norm": "rms",
              "activation": "swiglu", "bias": False},
    "data": {"task": "text", "block_size": 16},
    "train": {"max_steps": 100000, "batch_size": 4, "lr": 1e-2, "schedule": "wsd", "cooldown": 0.5,
              "warmup_steps": 5, "eval_every": 40, "eval_batches": 1, "eval_batch_size": 8, "checkpoint_every": 50,
              "restore_best": False, "log_every": 1, "processes": 1, "dtype": "float64", "budget_minutes": 0.2},
}


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# -- schedules --------------------------------------------------------------------------------------------------
def test_wsd_holds_then_decays_linearly_over_the_cooldown():
    lr, w, total, c, floor = 1.0, 10, 110, 0.25, 0.1
    s = make_schedule("wsd", lr, warmup_steps=w, max_steps=total, min_lr=floor, cooldown=c)

    def hand(step):
        if step < w:
            return lr * (step + 1) / (w + 1)
        p = min((step - w) / (total - w), 1.0)
        return lr if p < 1 - c else floor + (1 - p) / c * (lr - floor)
    got = [s(i) for i in range(130)]
    np.testing.assert_allclose(got, [hand(i) for i in range(130)], rtol=1e-12)
    assert got[84] == lr and got[110] == pytest.approx(floor) and got[95] < lr


def test_wsd_sqrt_cooldown_is_one_minus_the_root_of_the_cooldowns_progress():
    lr, w, total, c, floor = 1.0, 10, 110, 0.25, 0.1
    s = make_schedule("wsd", lr, warmup_steps=w, max_steps=total, min_lr=floor, cooldown=c, cooldown_shape="sqrt")

    def hand(step):
        if step < w:
            return lr * (step + 1) / (w + 1)
        p = min((step - w) / (total - w), 1.0)
        return lr if p < 1 - c else floor + (1 - math.sqrt((p - (1 - c)) / c)) * (lr - floor)
    got = [s(i) for i in range(130)]
    np.testing.assert_allclose(got, [hand(i) for i in range(130)], rtol=1e-12)
    linear = make_schedule("wsd", lr, warmup_steps=w, max_steps=total, min_lr=floor, cooldown=c)
    assert got[84] == lr and got[110] == pytest.approx(floor)
    assert all(got[i] < linear(i) for i in range(86, 110))      # below the straight line inside the cooldown


@pytest.mark.parametrize("name,shape", [("constant", "linear"), ("linear", "linear"), ("cosine", "linear"),
                                        ("wsd", "linear"), ("wsd", "sqrt")])
def test_a_schedule_by_progress_is_the_schedule_by_step(name, shape):
    s = make_schedule(name, 3e-3, warmup_steps=7, max_steps=57, min_lr=3e-4, cooldown=0.4, cooldown_shape=shape)
    for step in range(70):
        assert s.at(step, (step - 7) / 50) == pytest.approx(s(step), rel=1e-12)


def test_bad_wsd_settings_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="cooldown"):
        Trainer(apply_overrides(TINY, ["train.cooldown=0"]), tmp_path / "r")
    with pytest.raises(ValueError, match="cooldown_shape"):
        Trainer(apply_overrides(TINY, ["train.cooldown_shape=cosine"]), tmp_path / "r")
    with pytest.raises(ValueError, match="cooldown_shape"):
        Schedule("wsd", 1e-3, decay_steps=10, cooldown_shape="cosine")      # the class itself, not only the config
    with pytest.raises(ValueError, match="min_lr"):
        Trainer(apply_overrides(TINY, ["train.min_lr=1.0"]), tmp_path / "r")


# -- the budget -------------------------------------------------------------------------------------------------
def test_budget_progress_and_fit(fake_clock):
    fake_clock.tick = 0.0            # a stopped clock: the figures are exact (a loaded machine's pause between two
    b = Budget(100.0)                # statements moved them on the real clock)
    b.start -= 10.0                  # 10 s spent
    assert b.progress(0, warmup_steps=5) == 0.0 and b.warmup_end is None
    assert b.progress(5, warmup_steps=5) == 0.0 and b.warmup_end == 10.0
    b.val_examples, b.eval_seconds_per_example, b.save_seconds = 100, 0.1, 1.0
    reserve = b.reserve()
    assert reserve == pytest.approx(1.5 * (10 + 2) + 1.0)
    b.start -= 40.0
    assert b.progress(6, 5) == pytest.approx(40 / (100 - reserve - 10), rel=1e-12)
    b.step_seconds.append(100 - reserve - b.used() - 1.0)
    assert b.fits() and b.fits(extra=0.999) and not b.fits(extra=1.001)


def test_a_budgeted_run_ends_within_its_budget_with_the_decay_done(tmp_path, fake_clock):
    run = tmp_path / "run"
    s = Trainer(TINY, run, quiet=True).train()
    assert s["stopped_by"] == "time budget" and s["budget_seconds"] == 12.0
    assert s["budget_used_seconds"] <= 12.0 and s["steps"] > 100
    lines = [m for m in _metrics(run) if "lr" in m]
    lrs = [m["lr"] for m in lines]
    assert max(lrs) == pytest.approx(1e-2)                  # held at the peak ...
    assert lrs[-1] < 0.05 * 1e-2                             # ... and decayed to (nearly) min_lr = 0 at the end
    peak_until = max(i for i, lr in enumerate(lrs) if lr == pytest.approx(1e-2))
    assert 0.3 < peak_until / len(lrs) < 0.7                 # cooldown 0.5: the decay takes the second half
    assert math.isfinite(s["best_val_loss"]) and s["best_step"] == s["steps"]


def test_a_resumed_budgeted_run_spends_the_same_budget(tmp_path, fake_clock):
    run = tmp_path / "run"
    first = Trainer(TINY, run, quiet=True)
    first.train(stop_after=200)
    first.save_checkpoint()
    used = first.budget.used()
    first.close()
    resumed = Trainer(None, run, resume=True, quiet=True)
    assert resumed.budget.used() >= used
    s = resumed.train()
    assert s["stopped_by"] == "time budget" and s["budget_used_seconds"] <= 12.0
    whole = Trainer(TINY, tmp_path / "whole", quiet=True).train()
    assert abs(s["steps"] - whole["steps"]) < 0.1 * whole["steps"]


def test_a_budget_too_small_for_one_step_still_saves_and_scores(tmp_path, fake_clock):
    fake_clock.tick = 0.5
    s = Trainer(apply_overrides(TINY, ["train.budget_minutes=0.01"]), tmp_path / "r", quiet=True).train()
    assert s["steps"] == 0 and s["stopped_by"] == "time budget"
    assert (tmp_path / "r" / "model.safetensors").is_file() and math.isfinite(s["best_val_loss"])


def test_a_budget_under_mpi_is_one_clear_error(tmp_path):
    from types import SimpleNamespace

    world = SimpleNamespace(is_writer=True, size=2, rank=0)
    with pytest.raises(ValueError, match="budget_minutes is not available under MPI"):
        Trainer(TINY, tmp_path / "r", world=world)


# -- FLOPs and the profile --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads,activation,tied", [(None, "gelu", True), (2, "swiglu", False)])
def test_flops_per_token_by_hand(kv_heads, activation, tied):
    d, L, h, V, T, ff = 24, 3, 4, 30, 10, 40
    model = GPT(V, T, n_layers=L, n_heads=h, d_model=d, d_ff=ff, n_kv_heads=kv_heads, activation=activation,
                tie_weights=tied, positional="rope" if kv_heads else "learned", norm="rms" if kv_heads else "layer",
                rng=np.random.default_rng(0))
    kv = (kv_heads or h) * d // h
    per_layer = 2 * d * (d + 2 * kv) + 2 * d * d + 2 * d * ff * (3 if activation == "swiglu" else 2) + 4 * T * d
    assert forward_flops_per_token(model, T) == L * per_layer + 2 * d * V
    assert training_flops_per_token(model, T) == 3 * forward_flops_per_token(model, T)


def test_flops_are_what_the_modules_answer_for_adapted_and_quantized_layers():
    """Each module counts its own products (no search of the model by type): a LoRA layer counts its frozen base
    and its adapters, 2·r·(d_in + d_out) each, and an int8 layer the float layer's products."""
    from numformer.lora import add_lora
    from numformer.quantize import quantize_model

    d, L, h, V, T, r = 16, 2, 2, 20, 8, 4
    make = lambda: GPT(V, T, n_layers=L, n_heads=h, d_model=d, rng=np.random.default_rng(0))  # noqa: E731
    plain = forward_flops_per_token(make(), T)
    adapted = add_lora(make(), r=r, alpha=8, target_modules=["q_proj", "v_proj"], rng=0)
    assert forward_flops_per_token(adapted, T) == plain + L * 2 * (2 * r * (d + d))
    quantized = make()
    quantize_model(quantized)
    assert forward_flops_per_token(quantized, T) == plain


def test_the_profile_times_every_family_of_a_step():
    from numformer.bench.profile import profile_training_step
    from numformer.nn.dispatch import OPS

    before = dict(OPS)
    p = profile_training_step(TINY, processes=2, steps=2, warmup=1)
    assert OPS == before                                     # the timers are removed
    fam = p["families"]
    for name in ("linear (matrix products)", "attention", "norm", "activation", "rotary positions",
                 "cross-entropy", "optimizer and clipping", "embedding", "other"):
        assert name in fam and fam[name] >= 0
    assert sum(fam.values()) == pytest.approx(p["step_seconds"], rel=1e-6)
    assert p["batch_share"] == 2 and p["tokens_per_step"] == 2 * 16
    assert len(p["round_step_seconds"]) == 1 and p["step_seconds"] == p["round_step_seconds"][0]


def test_the_profile_reports_its_median_round(monkeypatch, fake_clock):
    """Of several timed rounds the one of median step time is reported, families included: a round slowed by
    another process (here the second: its clipping advances the fake clock by 100 s a step) is not shown."""
    from numformer.bench import profile as prof

    calls = {"n": 0}
    real = prof.clip_grad_norm

    def clip(*a, **k):
        calls["n"] += 1
        if 4 <= calls["n"] <= 5:                  # the second timed round's two steps (after one warm-up step)
            fake_clock.now += 100.0
        return real(*a, **k)

    monkeypatch.setattr(prof, "clip_grad_norm", clip)
    p = prof.profile_training_step(TINY, processes=2, steps=2, warmup=1, rounds=3)
    rounds = p["round_step_seconds"]
    assert calls["n"] == 7 and len(rounds) == 3
    assert rounds[1] >= 100 > max(rounds[0], rounds[2])
    assert p["step_seconds"] == sorted(rounds)[1] == max(rounds[0], rounds[2])
    assert sum(p["families"].values()) == pytest.approx(p["step_seconds"], rel=1e-6)
    assert p["families"]["optimizer and clipping"] < 100


def test_matmul_peak_counts_two_n_cubed(fake_clock):
    """On a fake clock where every product takes 1 ms: 2·n³ operations per product, the best of them (a range on
    the real clock compared the machine's load with a bound)."""
    from numformer.bench.profile import matmul_peak

    fake_clock.tick = 1e-3
    assert matmul_peak(n=128, threads=1, min_seconds=0.01) == pytest.approx(2 * 128 ** 3 / 1e-3, rel=1e-9)


@pytest.mark.parametrize("all_cores, expected", [(2.3e9, 93e9), (180e9, 180e9)])
def test_the_all_core_peak_is_never_below_the_one_thread_peak(monkeypatch, all_cores, expected):
    """A quick run measured 2.3 GFLOP/s on 2 cores against 93 on one (its BLAS threads waiting for a busy core),
    which made an MFU of 195%: the all-core peak is at least the one-thread one."""
    from numformer.experiments import speedrun

    monkeypatch.setattr(speedrun, "usable_cores", lambda: 2)
    monkeypatch.setattr(speedrun, "matmul_peak", lambda threads, **kw: 93e9 if threads == 1 else all_cores)
    assert speedrun._peaks(quick=True) == {"cores": 2, "one_thread": 93e9, "all_cores": expected}


# -- the experiments --------------------------------------------------------------------------------------------
def test_the_ablation_ends_at_the_recipe():
    from numformer.config import resolve_config
    from numformer.experiments.speedrun import LADDER, ladder_configs, recipe_of_ladder, speedrun_config

    recipe = speedrun_config()
    last = recipe_of_ladder(recipe["train"]["budget_minutes"])
    rows = ladder_configs(1.0)
    assert len(rows) == len(LADDER) and rows[0][1]["model"]["positional"] == "learned"
    dropped = [i for i, (change, _) in enumerate(rows) if not change.kept]
    for i in dropped:                       # a dropped change is not carried into the next row
        if i + 1 < len(rows):
            assert rows[i + 1][1]["train"]["optimizer"] == rows[i - 1][1]["train"]["optimizer"]
    resolved = [resolve_config(c)[0] for c in (last, recipe)]
    for section in ("model", "data", "train"):
        assert resolved[0][section] == resolved[1][section], section


def test_quick_speedrun_pages_are_written(tmp_path, fake_clock):
    from numformer.experiments import Context, resolve, run_experiment

    fake_clock.tick = 0.05       # the budget is checked on the fake clock: a loaded machine cannot overrun it
    ctx = Context(runs_dir=tmp_path / "runs", results_dir=tmp_path / "results", quick=True, quiet=True,
                  overwrite=True, seeds=2)
    (main,) = resolve("shakespeare_speedrun")
    record = run_experiment(main, ctx)
    assert record["figures"]["seeds"] == 2 and len(record["runs"]) == 2
    assert all(r["budget_used_seconds"] <= r["budget_seconds"] for r in record["runs"])
    page = (tmp_path / "results" / "shakespeare_speedrun.md").read_text()
    assert "quick" in page and "Not run yet" in page and "mean ± sd" in page
    (profile,) = resolve("shakespeare_speedrun_profile")
    ctx.seeds = 0
    run_experiment(profile, ctx)
    run_experiment(main, ctx)
    page = (tmp_path / "results" / "shakespeare_speedrun.md").read_text()
    assert "Where a training step's time goes" in page


@pytest.mark.slow
def test_the_speedrun_honours_a_shortened_budget(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "numformer.cli", "reproduce", "shakespeare_speedrun", "--results",
                          str(tmp_path / "results"), "--runs", str(tmp_path / "runs"), "--set",
                          "train.budget_minutes=1", "--quiet"], capture_output=True, text=True, cwd=REPO_ROOT,
                         env=src_env())
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "results" / "shakespeare_speedrun.json").read_text())
    (run,) = record["runs"]
    # the budget is honoured on the fake clock (the tests above); a real clock on a shared machine only records it
    assert run["budget_seconds"] == 60 and run["budget_used_seconds"] > 0
    assert run["steps"] > 50 and math.isfinite(run["val_loss"]) and run["val_loss"] < 2.6
    # MFU divides two speeds measured at different times: on a loaded machine it may exceed 1, so only its sign
    assert run["mfu_training_steps"] > 0 and math.isfinite(run["mfu_training_steps"])
    assert (tmp_path / "results" / "shakespeare_speedrun.md").is_file()


def test_the_profile_example_of_the_benchmarks_page_runs(capsys, monkeypatch):
    text = (REPO_ROOT / "docs" / "reference" / "benchmarks.md").read_text(encoding="utf-8")
    section = text.split("## Where a training step's time goes", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO_ROOT)
    exec(compile(code, "benchmarks.md", "exec"), {})
    out = capsys.readouterr().out
    assert "linear (matrix products)" in out and "MFU" in out


@pytest.mark.slow        # about a minute of two trainings (make test-slow)
def test_quick_pytorch_anchor_trains_both_recipes_within_the_budget(tmp_path, fake_clock):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from numformer.experiments import Context, resolve, run_experiment

    fake_clock.tick = 0.01       # the budget is checked on the fake clock: a loaded machine cannot overrun it
    ctx = Context(runs_dir=tmp_path / "runs", results_dir=tmp_path / "results", quick=True, quiet=True)
    (anchor,) = resolve("shakespeare_speedrun_torch")
    record = run_experiment(anchor, ctx)
    for key, model_class in (("recipe", "ArceeForCausalLM"), ("nanogpt_cpu", "TorchGPT")):
        run = record["runs"][key]
        assert run["model_class"] == model_class and run["wall_seconds"] <= run["budget_seconds"]
        assert math.isfinite(run["val_loss"]) and run["val_loss"] < math.log(65) + 0.5
    assert "The PyTorch anchor" in (tmp_path / "results" / "shakespeare_speedrun_torch.md").read_text()


def test_the_profile_page_names_each_profiles_cpu_and_keeps_one_column_per_cpu_model():
    from numformer.experiments.speedrun import profile_markdown

    def profile(commit, step_ms, cpu=None):
        entry = {"commit": commit, "families": {"attention": step_ms / 2e3}, "step_seconds": step_ms / 1e3,
                 "mfu_one_worker": 0.5, "processes": 2, "batch_share": 6}
        return entry if cpu is None else {**entry, "cpu": cpu}

    record = {"command": "numformer reproduce shakespeare_speedrun_profile", "date": "2026-11-29",
              "machine": {"cpu": "AMD EPYC"},    # written before profiles named their CPU model
              "profiles": [profile("aaa", 90.0), profile("bbb", 89.0), profile("ccc", 80.0, "Intel Xeon (SPR)"),
                           profile("ddd", 95.0, "AMD EPYC (Zen 3)"), profile("eee", 94.0, "AMD EPYC (Zen 3)")]}
    head = next(line for line in profile_markdown(record).splitlines() if line.startswith("| op family"))
    # the earliest (the 'before'), then the latest profile on each CPU model, each column naming its CPU
    assert head == ("| op family | ms/step, aaa, AMD EPYC (model not recorded) | ms/step, bbb, AMD EPYC (model not "
                    "recorded) | ms/step, ccc, Intel Xeon (SPR) | ms/step, eee, AMD EPYC (Zen 3) |")
    assert "| **step** | **90.00** | **89.00** | **80.00** | **94.00** |" in profile_markdown(record)


def _committed(name):
    path = Path(__file__).resolve().parents[1] / "results" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_pytorch_anchor_is_compared_only_on_the_cpu_of_numformers_runs():
    from numformer.experiments.speedrun import speedrun_markdown, torch_markdown

    main, anchor = _committed("shakespeare_speedrun"), _committed("shakespeare_speedrun_torch")
    zen3 = {"cpu": "AMD EPYC", "cpu_label": "AMD EPYC (Zen 3, family 25 model 1, AVX2)", "cores": 2}
    zen4 = {"cpu": "AMD EPYC", "cpu_label": "AMD EPYC (Zen 4, family 25 model 17, AVX-512)", "cores": 2}
    main["machine"], anchor["machine"] = zen4, zen3
    page = torch_markdown(anchor, level="##", main=main)
    assert "Zen 3, family 25 model 1, AVX2); PyTorch" in page
    assert ("numformer's runs ran on AMD EPYC (Zen 4, family 25 model 17, AVX-512) and PyTorch's on AMD EPYC "
            "(Zen 3, family 25 model 1, AVX2)") in page
    assert "numformer over PyTorch" not in page and "minus PyTorch's" not in page
    anchor["machine"] = zen4
    page = torch_markdown(anchor, level="##", main=main)
    assert "numformer over PyTorch" in page and "not compared" not in page
    del anchor["machine"]                                 # a record written before machines were recorded
    assert "not compared" in torch_markdown(anchor, level="##", main=main)
    parts = {name: (None, None) for name in ("shakespeare_speedrun_ablation", "shakespeare_speedrun_torch",
                                             "shakespeare_speedrun_profile")}
    assert "2 cores, AMD EPYC (Zen 4, family 25 model 17, AVX-512)). Data:" in speedrun_markdown(main, parts)
