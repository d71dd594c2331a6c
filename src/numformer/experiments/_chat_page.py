"""The chat pipeline's results page (results/chat_pipeline.md) and its figure, from its record."""
from __future__ import annotations

from pathlib import Path

from ..analysis import ema, new_figure, read_metrics, save_figure, series
from ._chat_data import CUT, QUESTION, REQUEST, TOPICS
from .runner import page_head

STAGE_WHAT = {"imdb_lm": "the IMDB BPE language model (`reproduce imdb_lm`)",
              "imdb": "the judge: the IMDB classifier (`reproduce imdb`)",
              "data": "conversations and pairs built from the reviews and the instruction set",
              "sft_full": "supervised fine-tuning, the whole model", "dpo": "DPO from sft_full"}


def draw_curves(run_dirs, path):
    """Training loss (smoothed) of each supervised fine-tuning run with its validation loss, and DPO's loss."""
    fig = new_figure(11.0, 4.0)
    sft_ax, dpo_ax = fig.subplots(1, 2)
    for name, run_dir in run_dirs.items():
        metrics = Path(run_dir) / "metrics.jsonl"
        records = read_metrics(metrics) if metrics.is_file() else []
        ax = dpo_ax if name == "dpo" else sft_ax
        steps, loss = series(records, "train_loss")
        if len(steps):
            line, = ax.plot(steps, ema(loss) if len(loss) > 20 else loss, lw=1.2, label=f"{name} (train)")
            vs, vl = series(records, "val_loss")
            if len(vs):
                ax.plot(vs, vl, "o", color=line.get_color(), ms=4, label=f"{name} (validation)")
    sft_ax.set_title("supervised fine-tuning: loss on the assistant's tokens")
    dpo_ax.set_title("DPO: loss −log σ(β · margin)")
    for ax in (sft_ax, dpo_ax):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    return save_figure(fig, path)


def _mib(n):
    return f"{n / 2 ** 20:,.0f}"


def _ci(s):
    return f"{s['ci95'][0]:.3f}–{s['ci95'][1]:.3f}"


def figures_section(r):
    full, f = r["results"]["sft_full"], r["figures"]
    rows = ["| figure | value | 95% interval | n | target | reached |", "|---|---|---|---|---|---|"]
    for key, s in (("accuracy", full["classify"]), ("judged_share", full["write"])):
        met = r["met"].get(key)
        rows.append(f"| {key} (sft_full) | {f[key]:.4f} | {_ci(s)} | {s['n']:,} | {r['targets'].get(key, '')} | "
                    f"{'' if met is None else ('yes' if met else 'no')} |")
    dpo = r["results"]["dpo"]
    rows.append(f"| dpo_accuracy (after DPO) | {f['dpo_accuracy']:.4f} | {_ci(dpo['classify'])} | "
                f"{dpo['classify']['n']:,} | | |")
    rows.append(f"| dpo_judged_share (after DPO) | {f['dpo_judged_share']:.4f} | {_ci(dpo['write'])} | "
                f"{dpo['write']['n']:,} | | |")
    floor = r["floor"]["accuracy"]
    judge = r["timing"].get("imdb", {}).get("test_accuracy")      # the judge run's own, which may not be imdb.md's
    rows += ["", f"Accuracy floor {floor:g}: {'above' if f['accuracy'] >= floor else 'below'} it. The intervals are "
                 f"95% Wilson score intervals of the share over the reviews evaluated; the judged share also carries "
                 f"the judge's own errors (" + (f"its test accuracy: {judge:.4f}, " if judge is not None else "")
             + "its run in the stages below)."]
    return rows


def stages_section(r):
    rows = ["| stage | what | run | steps | wall time |", "|---|---|---|---|---|"]
    for name, t in r["timing"].items():
        what = STAGE_WHAT.get(name) or (f"supervised fine-tuning, LoRA rank {name.rsplit('_r', 1)[1]}"
                                        if name.startswith("sft_lora") else "")
        if t.get("val_bpb") is not None:
            what += f": {t['val_bpb']:.4f} bits per byte on its validation reviews, commit {t['commit']}"
        if t.get("test_accuracy") is not None:
            what += f": test accuracy {t['test_accuracy']:.4f}, commit {t['commit']}"
        if t.get("train_seconds") is not None:
            what += f" (its training steps took {t['train_seconds'] / 60:.1f} min, commit {t['commit']})"
        steps = t.get("steps")
        rows.append(f"| {name} | {what} | {t['source']} | {'' if steps is None else f'{steps:,}'} | "
                    f"{t['seconds'] / 60:.1f} min |")
    load = r.get("load_average")
    rows += ["", f"Wall time of the whole command {r['wall_time_s'] / 60:.1f} min on {r['machine']['cores']} cores "
                 f"({r['machine']['cpu']})" + (f"; load average at the end {load[0]:.1f} (1 min), {load[1]:.1f} "
                                               f"(5 min), {load[2]:.1f} (15 min)" if load else "")
             + ". A reused or given run took no time here. The base runs are the ones named (their folders under "
               "--runs); results/imdb_lm.md and results/imdb.md describe the committed runs of those experiments, "
               "which may be other runs."]
    return rows


def lora_section(r):
    rows = ["| run | trainable parameters | accuracy (95% interval) | judged share | peak memory (MiB) | "
            "time per step (s) | CPU time of the process (s) | validation loss |", "|---|---|---|---|---|---|---|---|"]
    for name, run in r["runs"].items():
        if name == "dpo":
            continue
        m, s, res = run["measured"], run["summary"], r["results"][name]
        rows.append(f"| {name} | {m['trainable_parameters']:,} of {m['parameters']:,} | "
                    f"{res['classify']['accuracy']:.4f} ({_ci(res['classify'])}) | {res['write']['share']:.4f} | "
                    f"{_mib(m['peak_rss_bytes'])} | {s['train_seconds'] / max(s['steps'], 1):.3f} | "
                    f"{m['cpu_seconds']:,.0f} | {s['best_val_loss']:.4f} |")
    rows += ["", "Peak memory: the high-water mark of the training process's resident memory (`VmHWM`; each run "
                 "trains in a process of its own, one process, no data-parallel workers), everything included: "
                 "the interpreter, the encoded conversations, the model, its gradients and optimizer moments, and "
                 "the activations of a batch. Time per step: the seconds of the training steps over their number "
                 "(evaluations left out), on a machine shared with other work."]
    return rows


def dpo_section(r):
    p, sft, dpo = r["pairs"], r["results"]["sft_full"], r["results"]["dpo"]
    return [
        "| on held-out pairs of test reviews / test requests | before DPO (sft_full) | after DPO |", "|---|---|---|",
        f"| implicit reward prefers the chosen review (share of pairs) | 0.5 (the policy is the reference: every "
        f"margin is 0) | {p['reward_accuracy']['share']:.4f} ({_ci(p['reward_accuracy'])}) |",
        f"| the model's log-probability is higher for the chosen review | "
        f"{p['reference_prefers_chosen']['share']:.4f} | {p['policy_prefers_chosen']['share']:.4f} |",
        f"| judged share of written reviews | {sft['write']['share']:.4f} ({_ci(sft['write'])}) | "
        f"{dpo['write']['share']:.4f} ({_ci(dpo['write'])}) |",
        f"| classification accuracy | {sft['classify']['accuracy']:.4f} | {dpo['classify']['accuracy']:.4f} |", "",
        f"{p['reward_accuracy']['n']:,} held-out pairs: test reviews of the requested sentiment chosen, test reviews "
        f"of the other rejected, matched by length; mean log-ratio margin after DPO {p['mean_margin']:.3f}."]


def examples_section(r):
    lines = []
    for name in ("sft_full", "dpo"):
        res = r["results"][name]["write"]
        lines += [f"Reviews written on request by **{name}** (judged label and its probability):", ""]
        for ex in res["examples"]:
            text = " ".join(ex["text"].split())
            lines += [f"- *{ex['requested']}* requested, judged *{ex['judged']}*"
                      + (f" ({ex['p']:.2f})" if ex["p"] is not None else "") + f": {text[:600] or '(empty)'}"]
        lines.append("")
    cls = r["results"]["sft_full"]["classify"]["examples"]
    lines += ["Labels generated by sft_full for the first test reviews evaluated:", "",
              *[f"- test review {e['review']} ({e['label']}): `{e['reply']}`" for e in cls], ""]
    return lines


def chat_section(r):
    c = r["chat"]
    piped = "\\n".join(line.replace("'", "'\\''") for line in c["input"])
    return ["The final model (after DPO), each line of the input a message, sampled with the evaluation's "
            "settings and seed; stdout as the command printed it:", "", "```console",
            f"$ printf '{piped}\\n' | {c['command']}", c["output"].rstrip(), "```", ""]


def recipe_section(r):
    p, d = r["config"]["pipeline"], r["data"]
    topics = ", ".join(t for t, _ in TOPICS)
    subset = f"a random subset of {p['test_reviews']:,} (seed {p['seed']})" if p["test_reviews"] else "all"
    return [
        f"- **Conversations** (numformer's default chat format, `User: ...` / `Assistant: ...`, each reply ending "
        f"with `<|endoftext|>`; the loss on the assistant's tokens): {d['classify']:,} training reviews asked "
        f"\"{QUESTION}\" (answered `positive` or `negative`), {d['write']:,} requests "
        f"\"{REQUEST.format(label='positive', topic='a horror film')}\" answered by a training review of that "
        f"label and topic (reviews of at most {d['write_room']} tokens, half of each label), and "
        f"{d['instructions']:,} instruction records of `instruction-data.json` (its first 85%, LLMs-from-scratch's "
        f"training split; the next 10% is its test split, the last 5% its validation split) × "
        f"{p['instruction_repeats']}.",
        f"- **Topics**: a review is about the first of these whose word it contains: {topics}; else a movie.",
        f"- **Long reviews**: a review longer than {d['review_room']} tokens (the context less the request) keeps "
        f"its first {d['head_tokens']} tokens and its last ones, joined by `{CUT.strip()}`: "
        f"{d['truncated_train']:,} of the {d['classify']:,} training reviews asked, {d['truncated_test']:,} of the "
        f"test reviews evaluated.",
        f"- **Evaluation**: {subset} "
        f"of the {d['test_reviews']:,} test reviews classified by greedy generation (a reply whose first word is "
        f"not a label counts as wrong); {p['write_requests']} requests for a review (half positive), each about the "
        f"topic of a test review, sampled at temperature {p['temperature']:g}, top-k {p['top_k']}, at most "
        f"{p['max_new_tokens']} tokens, and judged by " + (f"the classifier {p['judge_run']} (pipeline.judge_run)."
                                                           if p.get("judge_run") else
                                                           "the classifier `imdb` under --runs (`reproduce imdb`)."),
        f"- **DPO pairs**: {d['dpo_pairs']:,} pairs of training reviews (not among the conversations' replies), "
        f"each request's review chosen and one of the other sentiment and about the same length rejected"
        + (", and the instruction set's preference pairs" if p["dpo_instruction_pairs"] else "") + ".",
        f"- The settings of every run are in `{r['name']}.json` (`run_configs`); the pipeline's in "
        f"`configs/{r['name']}.toml`."]


def chat_markdown(r):
    lines = page_head(r, f"Data: IMDB ({r['data']['train_reviews']:,} training and {r['data']['test_reviews']:,} "
                         f"test reviews) and LLMs-from-scratch's instruction set.")
    lines += figures_section(r) + ["", "## The stages", ""] + stages_section(r)
    lines += ["", "## Full fine-tuning against LoRA", ""] + lora_section(r)
    lines += ["", "## DPO: before and after", ""] + dpo_section(r)
    lines += ["", "## What the models write", ""] + examples_section(r)
    lines += ["## A chat session", ""] + chat_section(r)
    lines += ["## How it was made", ""] + recipe_section(r) + [
        "", "**Learning curves**", "", f"![Learning curves](figures/{r['name']}_curves.png)", ""]
    return "\n".join(lines)
