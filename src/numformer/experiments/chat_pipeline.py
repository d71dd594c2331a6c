"""From a language model to a chat model, measured: ``numformer reproduce chat_pipeline``.

The stages (settings in ``configs/chat_pipeline.toml``; each fine-tuning stage has a step budget, so that its
results do not depend on the machine's load):

1. the IMDB BPE language model of ``numformer reproduce imdb_lm`` (runs/imdb_lm), and numformer's IMDB
   classifier of ``numformer reproduce imdb`` (runs/imdb), the judge of written reviews: each reused when its
   run folder holds a finished run of the same config and code (``_runs.reusable_run``), trained by its own
   experiment otherwise (which then writes its own results page too);
2. supervised fine-tuning (``[data] task = "chat"``, the loss on the assistant's tokens) on conversations built
   from the labelled training reviews and the instruction set (``_chat_data``): the whole model, and LoRA
   adapters of each rank of ``lora_ranks`` on every linear layer of the blocks;
3. evaluation on the IMDB test reviews, which no stage read: the label each model generates for a review
   (accuracy), and reviews it writes on request, judged by the classifier (the share judged as requested);
4. full fine-tuning against LoRA: accuracy, trainable parameters, the peak resident memory of the training
   process (its high-water mark, ``VmHWM``: each run trains in a process of its own) and time per step;
5. DPO (``objective = "dpo"``) from the fully fine-tuned model on pairs of training reviews (the one of the
   requested sentiment chosen, one of the other rejected), scored before and after on pairs of test reviews
   (the implicit reward's accuracy) and by the judged share;
6. a ``numformer chat`` session with the final model, fed from a pipe, written into the page.

Run folders: runs/imdb_lm, runs/imdb, and runs/chat_pipeline/{sft_full, sft_lora_r8, ..., dpo} beside the
conversations and pairs they train on (runs/chat_pipeline/data). A fine-tuning run is reused like the base
runs, when the run it starts from is reused too.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .._limits import read_json_file
from ..bench._measure import max_rss_bytes
from ..config import apply_overrides, load_config, resolve_config
from ..data.fetch import data_dir, locate
from ..data.text_datasets import load_imdb
from ..keys import check_section
from ..lora import merge_lora
from ..provenance import git_commit, machine_info
from ..run_files import load_tokenizer_state, write_json_atomic
from ..train import load_model
from ..train.run import load_tokenizer
from . import EXPERIMENTS, Experiment, Target, register
from . import _chat_data as cd
from . import _chat_eval as ce
from ._chat_page import chat_markdown, draw_curves
from ._runs import holds_anything, read_summary, reusable_run, start_run
from .runner import Context, find_config, run_experiment

NAME, BASE_LM, JUDGE = "chat_pipeline", "imdb_lm", "imdb"
MEASURED = "measured.json"          # written into a fine-tuning run folder by its training process
SECTIONS = {"pipeline", "sft", "dpo"}
PIPELINE_DEFAULTS = {
    "seed": 0, "data_path": "", "instructions": "", "lm_run": "", "judge_run": "", "given_runs": "", "classify": 12000, "write": 4000, "write_tokens": 200,
    "instruction_records": 935, "instruction_repeats": 1, "head_tokens": 64, "lora_ranks": [8, 16],
    "lora_alpha_per_rank": 2.0, "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"],
    "lora_lr": 2e-3, "dpo_pairs": 2000, "dpo_instruction_pairs": False, "held_out_pairs": 500,
    "test_reviews": 5000, "write_requests": 400, "max_new_tokens": 160, "temperature": 0.8, "top_k": 50,
    "eval_batch": 32}
QUICK = ["pipeline.classify=48", "pipeline.write=24", "pipeline.instruction_records=16", "pipeline.dpo_pairs=12",
         "pipeline.held_out_pairs=8", "pipeline.test_reviews=24", "pipeline.write_requests=8",
         "pipeline.max_new_tokens=16", "pipeline.eval_batch=8", "sft.train.max_steps=4", "sft.train.batch_size=4",
         "sft.train.eval_every=2", "sft.train.log_every=1", "sft.train.warmup_steps=1", "sft.data.val_size=4",
         "dpo.train.max_steps=3", "dpo.train.batch_size=4", "dpo.train.eval_every=3", "dpo.train.log_every=1",
         "dpo.data.val_size=2"]
CHAT_REVIEW_TOKENS = 60          # the review of the chat session: short, so that the conversation fits the context
QUICK_LM = ["data.block_size=256"]      # the quick language model's context (imdb_lm --quick has 32 tokens)


# -- the config ------------------------------------------------------------------------------------------------
def pipeline_config(ctx):
    """configs/chat_pipeline.toml with the quick settings (--quick) and --set applied; one error line naming a
    bad section or key."""
    config = apply_overrides(load_config(find_config(NAME)), (QUICK if ctx.quick else []) + list(ctx.overrides))
    unknown = sorted(set(config) - SECTIONS)
    if unknown:
        raise ValueError(f"{NAME}: unknown section(s) {unknown}; its config has {sorted(SECTIONS)}")
    config["pipeline"] = {**PIPELINE_DEFAULTS, **check_section("pipeline", config.get("pipeline", {}), {},
                                                                PIPELINE_DEFAULTS)}
    for stage in ("sft", "dpo"):
        section = config.setdefault(stage, {})
        bad = sorted(set(section) - {"data", "train"})
        if bad:
            raise ValueError(f"[{stage}] holds the fine-tuning run's [{stage}.data] and [{stage}.train] "
                             f"settings; unknown: {bad}")
    return config


def base_overrides(name, ctx, cfg):
    """The --set items a base experiment gets: the IMDB path when the pipeline names one, and for --quick a
    language model whose context holds a review (``QUICK_LM``)."""
    path = cfg["pipeline"]["data_path"]
    return ([f"data.path={json.dumps(path)}"] if path else []) + (QUICK_LM if ctx.quick and name == BASE_LM else [])


def base_resolved(name, ctx, cfg):
    """The resolved config a base experiment (imdb_lm, imdb) trains, as its own ``reproduce`` resolves it;
    with the run's saved tokenizer when it has one (so the vocabulary sizes are the run's). Resolving builds
    the task (minutes for imdb), so a command that checks its folders, then runs, resolves once."""
    exp, run_dir = EXPERIMENTS[name], ctx.runs_dir / name
    overrides = (tuple(exp.quick_overrides) if ctx.quick else ()) + tuple(base_overrides(name, ctx, cfg))
    files = tuple(_stamp(p) for p in (find_config(exp.config_name()), run_dir / "tokenizer.json"))
    return copy.deepcopy(_resolved(exp.config_name(), str(run_dir), overrides, files))


def _stamp(path):
    path = Path(path)
    return (str(path), path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else (str(path), None, None)


@functools.lru_cache(maxsize=8)
def _resolved(config_name, run_dir, overrides, stamps):
    """The resolved config (see ``base_resolved``, which hands out copies; ``stamps`` name the files it was read
    from, so that an edited file is read again)."""
    config = apply_overrides(load_config(find_config(config_name)), list(overrides))
    return resolve_config(config, tokenizer_state=load_tokenizer_state(run_dir))[0]


def folders(ctx, cfg):
    """The run folders and the data folder of the pipeline: the base runs are the experiments' (under --runs)
    unless pipeline.lm_run / judge_run name others."""
    root, p = ctx.runs_dir / NAME, cfg["pipeline"]
    return {"data": root / "data", "root": root,
            "lm": Path(p["lm_run"]).resolve() if p["lm_run"] else ctx.runs_dir / BASE_LM,
            "judge": Path(p["judge_run"]).resolve() if p["judge_run"] else ctx.runs_dir / JUDGE}


def stage_configs(cfg, ctx):
    """{stage: the config of its fine-tuning run}: sft_full, sft_lora_r{r} for each rank, dpo."""
    p, f = cfg["pipeline"], folders(ctx, cfg)
    seed = {"seed": p["seed"], "processes": 1}
    sft = {"model": {"init_from": str(f["lm"])},
           "data": {"task": "chat", "path": str(f["data"] / "sft.jsonl"), **cfg["sft"].get("data", {})},
           "train": {**cfg["sft"].get("train", {}), **seed}}
    stages = {"sft_full": sft}
    for r in p["lora_ranks"]:
        stages[f"sft_lora_r{r}"] = {**sft, "train": {**sft["train"], "lr": p["lora_lr"]},
                                    "lora": {"r": r, "alpha": p["lora_alpha_per_rank"] * r,
                                             "target_modules": p["lora_target_modules"]}}
    stages["dpo"] = {"model": {"init_from": str(f["root"] / "sft_full")},
                     "data": {"task": "preference", "path": str(f["data"] / "pairs.jsonl"),
                              **cfg["dpo"].get("data", {})},
                     "train": {"objective": "dpo", **cfg["dpo"].get("train", {}), **seed}}
    return stages


# -- the plan: which runs are reused, which are trained ---------------------------------------------------------
@dataclasses.dataclass
class Stage:
    name: str
    run_dir: Path
    config: dict | None          # a fine-tuning stage's run config (None for the base experiments)
    summary: dict | None         # the summary of the run reused, or None: trained by this command
    why: str | None              # why the run in the folder is not reused
    given: bool = False          # a run named by pipeline.lm_run / judge_run / given_runs, used as it is


def plan(ctx, cfg):
    """[Stage] in training order: the base experiments (a run named by pipeline.lm_run / judge_run is used as
    it is), then each fine-tuning run (reused only when the run it starts from is reused or given)."""
    commit, f = git_commit(), folders(ctx, cfg)
    stages, fresh = [], set()
    for name, key in ((BASE_LM, "lm"), (JUDGE, "judge")):
        if cfg["pipeline"][f"{key}_run"]:
            stages.append(Stage(name, f[key], None, read_summary(f[key]), None, given=True))
            continue
        summary, why = _check_reuse(ctx, f[key], lambda n=name: base_resolved(n, ctx, cfg), commit)
        stages.append(Stage(name, f[key], None, summary, why))
        if summary is None:
            fresh.add(name)
    for name, config in stage_configs(cfg, ctx).items():
        if cfg["pipeline"]["given_runs"]:
            stages.append(given_stage(name, Path(cfg["pipeline"]["given_runs"]).resolve() / name, config))
            continue
        parent = BASE_LM if name.startswith("sft") else "sft_full"
        run_dir = f["root"] / name
        if parent in fresh:
            why = f"the run it starts from ({parent}) is trained again" if holds_anything(run_dir) else None
            stages.append(Stage(name, run_dir, config, None, why))
            fresh.add(name)
            continue
        summary, why = _check_reuse(ctx, run_dir, lambda c=config: resolve_config(c, sizes_only=True)[0], commit)
        if summary is not None and not (run_dir / MEASURED).is_file():
            summary, why = None, f"it has no {MEASURED} (its memory was not measured)"
        stages.append(Stage(name, run_dir, config, summary, why))
        if summary is None:
            fresh.add(name)
    return stages


def given_stage(name, run_dir, config):
    """The fine-tuning stage ``name`` from a folder named by pipeline.given_runs (an earlier pipeline's runs,
    evaluated again without training): used as it is, whatever commit trained it (the page names it), but only
    when it finished, has its ``MEASURED`` and was trained with the config this pipeline would train; else a
    ValueError naming the folder and why."""
    summary, why = reusable_run(run_dir, resolve_config(config, sizes_only=True)[0], None, same_commit=False)
    if summary is not None and not (run_dir / MEASURED).is_file():
        why = f"it has no {MEASURED} (its memory was not measured)"
    if why or summary is None:
        raise ValueError(f"pipeline.given_runs: {run_dir} cannot be used as the {name} run: "
                         f"{why or 'it holds no run'}; name the runs folder of an earlier chat_pipeline")
    return Stage(name, run_dir, config, summary, None, given=True)


def _check_reuse(ctx, run_dir, resolved, commit):
    """(summary, why not) of ``reusable_run`` for ``run_dir``; the resolved config (``resolved()``, which may
    read the data) is computed only when the folder holds a config to compare it with."""
    if ctx.overwrite or not holds_anything(run_dir):
        return None, None
    return reusable_run(run_dir, resolved() if (run_dir / "config.json").is_file() else {}, commit)


def run_dirs(exp, ctx):
    """The run folders this command trains into (for ``runner.planned_runs``)."""
    return [(s.run_dir, s.why) for s in plan(ctx, pipeline_config(ctx)) if s.summary is None]


# -- training ---------------------------------------------------------------------------------------------------
def run_base(stage, ctx, cfg):
    """The base experiment's run: given, reused, or trained by ``numformer reproduce NAME`` (which writes its
    page); returns how it was obtained and its figures (steps, bits per byte or test accuracy, commit)."""
    started, source = time.perf_counter(), "reused"
    if cfg["pipeline"]["lm_run" if stage.name == BASE_LM else "judge_run"]:
        source = "given"
    elif stage.summary is None:
        run_experiment(EXPERIMENTS[stage.name], dataclasses.replace(ctx, overrides=base_overrides(stage.name, ctx, cfg),
                                                                    seeds=0))
        source = "trained"
    s = read_json_file(stage.run_dir / "summary.json", "summary")
    return {"source": source, "seconds": round(time.perf_counter() - started, 1) if source == "trained" else 0.0,
            "steps": s.get("steps"), "run_dir": str(stage.run_dir), "commit": s.get("commit"),
            "val_bpb": s.get("best_val_bpb"), "test_accuracy": (s.get("test") or {}).get("test_accuracy")}


def train_measured(stage, ctx):
    """Train a fine-tuning stage in a process of its own (``train_child``), which records its peak resident
    memory and CPU time in the run folder (``MEASURED``); returns {summary, measured, source, seconds}."""
    if stage.summary is None:
        started = time.perf_counter()
        spec = {"config": stage.config, "run_dir": str(stage.run_dir), "overwrite": ctx.overwrite,
                "quiet": ctx.quiet}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "spec.json"
            path.write_text(json.dumps(spec), encoding="utf-8")
            code = "import sys; from numformer.experiments.chat_pipeline import train_child; train_child(sys.argv[1])"
            proc = subprocess.run([sys.executable, "-c", code, str(path)], env=_child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"the {stage.name} run failed (exit {proc.returncode}); its output is above")
        seconds, source = round(time.perf_counter() - started, 1), "trained"
    else:
        seconds, source = 0.0, "given" if stage.given else "reused"
    measured = read_json_file(stage.run_dir / MEASURED, "the training process's measures")
    return {"summary": read_summary(stage.run_dir), "measured": measured, "source": source, "seconds": seconds}


def _child_env():
    """The environment of a child Python: this numformer first on its path."""
    here = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}


def train_child(spec_path):
    """In a fresh process: train the run of ``spec_path`` and write ``MEASURED``: the process's peak resident
    memory (``VmHWM``), its CPU seconds, and the trainable and total parameters."""
    spec = read_json_file(spec_path, "the training's specification")
    ctx = Context(runs_dir=Path(spec["run_dir"]).parent, results_dir=Path(spec["run_dir"]).parent,
                  overwrite=spec["overwrite"], quiet=spec["quiet"])
    trainer = start_run(ctx, spec["config"], Path(spec["run_dir"]))
    trainer.train()
    params = list(trainer.model.parameters())
    cpu = os.times()
    write_json_atomic(Path(spec["run_dir"]) / MEASURED, {
        "peak_rss_bytes": max_rss_bytes(), "cpu_seconds": round(cpu.user + cpu.system, 1),
        "trainable_parameters": int(sum(p.data.size for p in params if p.requires_grad)),
        "parameters": int(sum(p.data.size for p in params))})


# -- the data ---------------------------------------------------------------------------------------------------
def imdb_path(p):
    return p["data_path"] or str(locate("imdb")["aclImdb_v1.tar.gz"])


def instruction_file(p, name):
    """The instruction set's file ``name``: beside pipeline.instructions, else in $NUMFORMER_DATA/instructions."""
    if p["instructions"]:
        return Path(p["instructions"]).parent / name
    folder = data_dir()
    if folder is None:
        raise ValueError(f"{NAME} needs the instruction set ({name}): set NUMFORMER_DATA to the data folder that "
                         f"holds instructions/{name}, set pipeline.instructions to its path, or set "
                         f"pipeline.instruction_records = 0")
    return folder / "instructions" / name


def instruction_records(p, name="instruction-data.json"):
    """The instruction set's training split (its first 85%), cut to pipeline.instruction_records."""
    if p["instruction_records"] == 0:
        return []
    return cd.instruction_split(cd.read_instructions(instruction_file(p, name)))[0][:p["instruction_records"]]


def pick_reviews(p, train, write_room):
    """{"classify": indices, "write": indices, "dpo": {label: indices}}: training reviews for each request,
    drawn with the seed (the writing and DPO reviews short enough to fit, disjoint, half of each label)."""
    n_write, n_match = p["write"] // 2, p["dpo_pairs"] // 2
    short = cd.short_reviews(train, write_room, np.random.default_rng([p["seed"], 2]), n_write + n_match)
    for k in (0, 1):
        if len(short[k]) < n_write + n_match:
            raise ValueError(f"pipeline.write = {p['write']} and dpo_pairs = {p['dpo_pairs']} need "
                             f"{n_write + n_match} {cd.LABELS[k]} training reviews of at most {write_room} tokens; "
                             f"there are {len(short[k])}: ask for fewer")
    order = np.random.default_rng([p["seed"], 1]).permutation(len(train))
    return {"classify": order[:p["classify"]], "write": np.concatenate([short[k][:n_write] for k in (0, 1)]),
            "dpo": {k: short[k][n_write:] for k in (0, 1)}}


def instruction_pairs(p):
    """The preference version of the instruction set's training split, as pairs whose replies end with END."""
    pairs = []
    for record in instruction_records(p, "instruction-data-with-preference.json"):
        prompt = cd.instruction_conversation({**record, "output": ""})[0]["content"]
        pairs.append({"prompt": prompt, "chosen": record["chosen"].strip() + cd.END,
                      "rejected": record["rejected"].strip() + cd.END})
    return pairs


def build_data(ctx, cfg, tokenizer, block_size):
    """Write the conversations (sft.jsonl), the DPO pairs (pairs.jsonl) and the held-out pairs of test reviews
    (held_out_pairs.jsonl); returns (the data's description, the test reviews, what is evaluated on them)."""
    p, folder = cfg["pipeline"], folders(ctx, cfg)["data"]
    imdb = load_imdb(imdb_path(p))
    train, test = (cd.Reviews(imdb[s].texts, imdb[s].labels, tokenizer) for s in ("train", "test"))
    room, head = cd.review_room(tokenizer, block_size), p["head_tokens"]
    write_room = min(p["write_tokens"], cd.write_room(tokenizer, block_size))
    picks = pick_reviews(p, train, write_room)
    instructions = instruction_records(p)
    cd.write_jsonl(folder / "sft.jsonl", cd.sft_conversations(train, picks, room, head, instructions,
                                                              p["instruction_repeats"]))
    pairs = cd.preference_pairs(train, picks["dpo"]) + (instruction_pairs(p) if p["dpo_instruction_pairs"] else [])
    cd.write_jsonl(folder / "pairs.jsonl", pairs)
    n_held = p["held_out_pairs"] // 2
    held = cd.short_reviews(test, write_room, np.random.default_rng([p["seed"], 3]), n_held)
    cd.write_jsonl(folder / "held_out_pairs.jsonl", cd.preference_pairs(test, held))
    evaluation = test_plan(p, test, held)
    info = {"review_room": room, "head_tokens": head, "write_room": write_room, "train_reviews": len(train),
            "test_reviews": len(test), "sft_conversations": len(picks["classify"]) + len(picks["write"])
            + len(instructions) * p["instruction_repeats"], "classify": len(picks["classify"]),
            "write": len(picks["write"]), "instructions": len(instructions), "dpo_pairs": len(pairs),
            "held_out_pairs": 2 * n_held, "truncated_train": sum(train.length(i) > room for i in picks["classify"]),
            "truncated_test": sum(test.length(i) > room for i in evaluation["classify"])}
    return info, test, evaluation


def test_plan(p, test, held):
    """The test reviews classified (all, or a random subset of pipeline.test_reviews drawn with the seed), the
    writing requests (label, topic of a test review; half of each label) and the chat session's messages."""
    n = p["test_reviews"] or len(test)
    classify = np.random.default_rng([p["seed"], 4]).choice(len(test), size=min(n, len(test)), replace=False)
    order = np.random.default_rng([p["seed"], 5]).permutation(len(test))
    half = p["write_requests"] // 2
    chosen = [i for k in (1, 0) for i in order[test.labels[order] == k][:half]]
    requests = [(int(test.labels[i]), cd.topic_of(test.texts[i])) for i in chosen]
    short = cd.short_reviews(test, CHAT_REVIEW_TOKENS, np.random.default_rng([p["seed"], 6]), 1,
                             skip=np.concatenate(list(held.values())))[1][0]
    lines = [f"{cd.QUESTION} {' '.join(test.texts[short].split())}",
             cd.REQUEST.format(label="negative", topic=cd.topic_of(test.texts[short])), *held_out_instruction(p)]
    return {"classify": classify, "requests": requests, "chat": lines, "chat_review": int(short)}


def held_out_instruction(p):
    """[the first instruction of the instruction set's test split that has no input], or [] without the set."""
    if p["instruction_records"] == 0:
        return []
    test = cd.instruction_split(cd.read_instructions(instruction_file(p, "instruction-data.json")))[1]
    return [r["instruction"].strip() for r in test if not str(r.get("input") or "").strip()][:1]


# -- evaluation -------------------------------------------------------------------------------------------------
def eval_model(run_dir, config):
    """A fine-tuned run's model for evaluation: LoRA adapters merged into the weights (the same outputs)."""
    model = load_model(run_dir)
    if config.get("lora"):
        merge_lora(model)
    return model.eval()


def evaluate_stage(model, tokenizer, test, evaluation, cfg, info, judge_dir):
    """{classification, writing}: the generated labels of the test reviews and the judged written reviews."""
    p = cfg["pipeline"]
    result = {"classify": ce.classify_by_generation(model, tokenizer, test, evaluation["classify"],
                                                    info["review_room"], info["head_tokens"], p["eval_batch"])}
    labels = [label for label, _ in evaluation["requests"]]
    texts, wall, cpu = ce.write_on_request(model, tokenizer, evaluation["requests"], p, p["seed"])
    started = time.perf_counter()
    result["write"] = {**ce.judged_share(judge_dir, texts, labels), "seconds": round(wall, 1),
                       "judge_seconds": round(time.perf_counter() - started, 1),
                       "topics": sorted({topic for _, topic in evaluation["requests"]})}
    return result


def run_pipeline(exp, ctx):
    started, cfg = time.perf_counter(), pipeline_config(ctx)
    stages = {s.name: s for s in plan(ctx, cfg)}
    timing = {}
    for name in (BASE_LM, JUDGE):
        timing[name] = run_base(stages[name], ctx, cfg)
    f = folders(ctx, cfg)
    tokenizer, lm_config = load_tokenizer(f["lm"]), read_json_file(f["lm"] / "config.json", "the language model's config")
    block_size = lm_config["data"]["block_size"]
    t0 = time.perf_counter()
    info, test, evaluation = build_data(ctx, cfg, tokenizer, block_size)
    timing["data"] = {"source": "built", "seconds": round(time.perf_counter() - t0, 1)}
    runs = {}
    for name, stage in stages.items():
        if stage.config is not None:
            runs[name] = train_measured(stage, ctx)
            timing[name] = {k: runs[name][k] for k in ("source", "seconds")}
            timing[name].update(steps=runs[name]["summary"]["steps"], commit=runs[name]["summary"]["commit"],
                                train_seconds=runs[name]["summary"]["train_seconds"])
    results, models = {}, {}
    for name, stage in stages.items():
        if stage.config is None:
            continue
        t0 = time.perf_counter()
        models[name] = eval_model(stage.run_dir, stage.config)
        results[name] = evaluate_stage(models[name], tokenizer, test, evaluation, cfg, info, f["judge"])
        timing[f"evaluate {name}"] = {"source": "measured", "seconds": round(time.perf_counter() - t0, 1)}
        if name not in ("sft_full", "dpo"):
            del models[name]
    t0 = time.perf_counter()
    pairs = ce.pair_preferences(models["dpo"], models["sft_full"], load_tokenizer_state(f["lm"]),
                                f["data"] / "held_out_pairs.jsonl", block_size)
    chat = ce.chat_transcript(stages["dpo"].run_dir, evaluation["chat"], cfg["pipeline"], cfg["pipeline"]["seed"])
    timing["pairs and chat"] = {"source": "measured", "seconds": round(time.perf_counter() - t0, 1)}
    record = make_record(exp, ctx, cfg, info, runs, results, pairs, chat, timing, evaluation)
    record["wall_time_s"] = round(time.perf_counter() - started, 1)
    figs = ctx.results_dir / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    draw_curves({name: stages[name].run_dir for name in runs}, figs / f"{NAME}_curves.png")
    return record, chat_markdown(record)


def make_record(exp, ctx, cfg, info, runs, results, pairs, chat, timing, evaluation):
    """The results record: the figures (targets on the fully fine-tuned model), every stage's details."""
    full, dpo = results["sft_full"], results["dpo"]
    figures = {"accuracy": full["classify"]["accuracy"], "judged_share": full["write"]["share"],
               "dpo_accuracy": dpo["classify"]["accuracy"], "dpo_judged_share": dpo["write"]["share"],
               "dpo_reward_accuracy": pairs["reward_accuracy"]["share"]}
    for name in results:
        if name.startswith("sft_lora"):
            figures[f"{name.removeprefix('sft_')}_accuracy"] = results[name]["classify"]["accuracy"]
    command = f"numformer reproduce {NAME}" + (" --quick" if ctx.quick else "") + \
        "".join(f" --set {o}" for o in ctx.overrides)
    record = {"name": NAME, "description": exp.description, "command": command, "commit": git_commit(),
              "date": datetime.date.today().isoformat(), "machine": machine_info(),
              "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
              "figures": figures, "targets": {t.metric: t.text() for t in exp.targets},
              "met": {t.metric: t.met(figures) for t in exp.targets}, "floor": {"accuracy": ACCURACY_FLOOR},
              "config": cfg, "data": info, "runs": runs, "results": results, "pairs": pairs,
              "chat": {"command": chat[0], "input": evaluation["chat"], "output": chat[1]},
              "timing": timing, "seed": cfg["pipeline"]["seed"],
              "run_configs": {name: read_json_file(Path(r["summary"]["run_dir"]) / "config.json", "a run's config")
                              for name, r in runs.items()}}
    if ctx.quick:
        record["quick_overrides"] = list(QUICK)
    return record


ACCURACY_FLOOR = 0.80

register(Experiment(
    NAME, "From the IMDB language model to a chat model on 2 cores: supervised fine-tuning on IMDB instructions "
    "and the instruction set (whole model, and LoRA of ranks 8 and 16), then DPO; measured on the IMDB test "
    "reviews, which no stage read, by the label each model generates and by the reviews it writes on request "
    "as numformer's IMDB classifier judges them.",
    [Target("accuracy", 0.85), Target("judged_share", 0.90)], custom=run_pipeline, run_dirs=run_dirs,
    time_limit_minutes=90.0))
