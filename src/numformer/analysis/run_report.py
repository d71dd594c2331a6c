"""``analyze_run``: the analysis report (``write_report``) of a run folder, with the run's own model,
tokenizers, task and validation loss. ``numformer analyze`` calls it.

Input: ``text`` encoded with the run's saved tokenizer (tokenizer.json); without it, the run's
task gives one example of ``split`` (``Task.analysis_example``). For an encoder-decoder
Transformer, ``src`` (or ``text``) is the source; the target is ``tgt`` if given, else the
model's own greedy translation of the source.

Head ablation metric: the run's validation loss, the mean cross-entropy per target token over a
fixed sample of ``ABLATION_BATCHES`` × (at most ``ABLATION_BATCH_SIZE``) sequences spread over
``split`` (``evaluate_loss(..., max_batches=ABLATION_BATCHES)``, seed 0: quick, and the same
sequences for every head);
where the run's data cannot be loaded, the cross-entropy on the report's own input.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..data.base import Task
from ..data.run_tokenizer import load_tokenizer_json, tokenizer_parts
from ..data.tokenizers import BOS, EOS, SpecialsTokenizer, token_labels
from ..interop.sources import tokenizer_from_state
from ..train import evaluate_loss, load_config_json, load_model, load_task
from .._limits import read_json_file
from .._results import check_report_folder
from ..run_files import weights_path
from .report import write_report

ABLATION_BATCHES = 4          # validation batches per ablation evaluation
ABLATION_BATCH_SIZE = 32      # at most this many sequences per batch


def analyze_run(run_dir, out=None, text=None, src=None, tgt=None, ablation=True, occlusion=True, split="val",
                log=None, overwrite=False):
    """Write RUN_DIR's analysis report into ``out`` (default RUN_DIR/report), a folder that is new, empty or holds
    an earlier report (else ``overwrite``: ``_results.check_report_folder``); returns the path of report.md.

    text / src / tgt: the input (see the module docstring; src and tgt for a Transformer only); split: the
    split of the task's example and of the ablation's loss (default "val"); ablation / occlusion: False skips
    that section; log: called with each progress line (default: print to stderr)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    run_dir = Path(run_dir)
    config = _check_run(run_dir)
    kind, data = config["model"]["type"], config.get("data", {})
    toks = _tokenizers(load_tokenizer_json(run_dir, data), kind, run_dir)   # as every command checks them
    out = Path(out) if out is not None else run_dir / "report"
    check_report_folder(out, overwrite)
    text, src = _check_options(kind, run_dir, text, src, tgt)
    given = text is not None or src is not None
    task, task_error = _load_task(run_dir, config, kind, given)
    if split == "test" and task is not None and not getattr(task, "has_test_split", True):
        # a text task's "test" would read the validation data: say so instead of mislabelling it
        raise ValueError(f"the task of {run_dir} ({data.get('task', kind)}) has no test split, only train and "
                         f"val; use --split val")
    model = load_model(run_dir, config)                         # after the checks: loading is the slow part
    decode = None if toks is None else {n: (lambda ids, t=t: token_labels(t, ids)) for n, t in toks.items()}
    labels = None
    if given:
        inputs, how = _given_input(model, toks, kind, data, run_dir, text, src, tgt)
    else:
        inputs, labels, how = _task_example(task, split, decode)
    metric, metric_name, metric_text = (_ablation_metric(task, task_error, config, split) if ablation
                                        else (None, None, None))
    log(f"analyzing {run_dir} ({kind}, {model.num_parameters():,} parameters) into {out} ...")
    path = write_report(out, model, inputs, decode_tokens=decode, tokens=labels,
                        metrics_path=run_dir / "metrics.jsonl", metric=metric, metric_name=metric_name,
                        occlusion_id=_occlusion_ids(toks, kind), ablation=ablation, occlusion=occlusion,
                        title=f"Analysis report: {run_dir.name} ({kind}, task {data.get('task', '?')})")
    _annotate(path, run_dir, how, metric_text)
    return path


def _check_run(run_dir):
    """The run's config; a clear error unless the folder holds a run with saved weights."""
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} does not exist or is not a folder; give a run folder written by "
                         f"`numformer train CONFIG --out RUN_DIR` (or `numformer reproduce NAME`, e.g. runs/copy)")
    if _is_hugging_face_folder(run_dir):
        raise ValueError(f"{run_dir} is a Hugging Face checkpoint, not a numformer run folder; analyze reads run "
                         f"folders: import it first (numformer import-hf {run_dir} --out RUN_DIR, then numformer "
                         f"analyze RUN_DIR), or look inside it with numformer explore {run_dir}")
    config = load_config_json(run_dir)
    weights_path(run_dir)
    return config       # without model.safetensors, load_model's note names the checkpoint it reads


def _is_hugging_face_folder(folder):
    """Whether folder/config.json is a Hugging Face model config (model_type or architectures, and no
    numformer [model] section)."""
    path = folder / "config.json"
    try:
        config = read_json_file(path, "config file") if path.is_file() else None
    except ValueError:
        return False
    return isinstance(config, dict) and "model" not in config and (
        "model_type" in config or "architectures" in config)


def _check_options(kind, run_dir, text, src, tgt):
    """(text, src) after checking which options fit the model; a Transformer reads ``text`` as its source."""
    for option, value in (("--tgt", tgt), ("--src", src)):
        if value is not None and kind != "transformer":
            raise ValueError(f"{option} is for encoder-decoder Transformer runs; {run_dir} holds a {kind} model: "
                             f"give its input with --text")
    if kind == "transformer" and text is not None:
        if src is not None:
            raise ValueError("give the source once: --src (or --text), not both")
        src, text = text, None
    if tgt is not None and src is None:
        raise ValueError("--tgt needs --src: the source sentence the target is read against")
    return text, src


def _load_task(run_dir, config, kind, given):
    """(task, None), or (None, the reason) when the run's data cannot be loaded and an input was given."""
    try:
        return load_task(run_dir, config), None
    except (ValueError, OSError, ImportError, KeyError, RuntimeError) as e:
        task_error = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not given:
            option = "--src" if kind == "transformer" else "--text"
            raise ValueError(f"the data of {run_dir} could not be loaded ({task_error}); give an input with "
                             f"{option} TEXT") from None
        return None, task_error


def _tokenizers(state, kind, run_dir):
    """{input name: tokenizer} for the model's inputs, from tokenizer.json (None: no saved tokenizer)."""
    if state is None:
        return None
    first, *rest = (tokenizer_from_state(part, run_dir) for part in tokenizer_parts(state))
    if "type" not in state and "src" in state:          # a translation run's: source, and target unless joint
        return {"src": first, "tgt": rest[0] if rest else first}
    if kind != "transformer":
        return {_input_name(kind): first}
    if state.get("type") == "symbols":                  # the synthetic tasks: one vocabulary on both sides
        return {"src": first, "tgt": first}
    raise ValueError(f"{run_dir}/tokenizer.json has no source and target tokenizers")


def _input_name(kind):
    return {"gpt": "idx", "classifier": "ids", "transformer": "src"}[kind]


def _encode(tokenizer, text, option, cls=False):
    if cls and isinstance(tokenizer, SpecialsTokenizer):
        ids = tokenizer.encode(text, add_cls=True)
        empty = len(ids) <= 1
    else:
        ids = tokenizer.encode(text)
        empty = not ids
    if empty:
        raise ValueError(f"{option} {text!r} has no tokens after tokenization with the run's tokenizer; "
                         f"give some text the model can read")
    return ids


def _given_input(model, toks, kind, data, run_dir, text, src, tgt):
    """(inputs, how) from the text options, encoded with the run's tokenizers."""
    if toks is None:
        raise ValueError(f"{run_dir} has no tokenizer.json, so text cannot be encoded; leave out "
                         f"--text/--src to analyse an example of the run's task")
    if kind == "transformer":
        return _translation_input(model, toks, src, tgt)
    cls = kind == "classifier" and bool(data.get("cls_token", False))
    name = _input_name(kind)
    inputs = {name: np.asarray(_encode(toks[name], text, "--text", cls=cls), dtype=np.int64)}
    return inputs, "from --text, encoded with the run's tokenizer" + (" (with `<cls>` first)" if cls else "")


def _translation_input(model, toks, src, tgt):
    """(inputs, how) of a Transformer: the source, and ``<bos>`` + the given target or the greedy translation."""
    src_ids = _encode(toks["src"], src, "--src")
    bos, eos = toks["tgt"].special_id(BOS), toks["tgt"].special_id(EOS)
    limit = model.max_len
    src_ids = src_ids[:limit]
    if tgt is not None:
        tgt_ids = [bos] + _encode(toks["tgt"], tgt, "--tgt")
        how = "source from --src, target from --tgt (teacher forcing: `<bos>` + target)"
    else:
        n = max(1, min(limit - 1, int(1.5 * len(src_ids)) + 10))
        hyp = model.generate(np.asarray(src_ids)[None], max_length=n, greedy=True, bos_id=bos, eos_id=eos)[0]
        model.clear_cache()
        tgt_ids = [bos] + [int(i) for i in hyp]
        how = ("source from --src; target: the model's own greedy translation, "
               f"`{' '.join(token_labels(toks['tgt'], tgt_ids[1:]))}`")
    return {"src": np.asarray(src_ids, dtype=np.int64), "tgt": np.asarray(tgt_ids[:limit], dtype=np.int64)}, how


def _task_example(task, split, decode):
    """(inputs, labels, how): the task's analysis example; labels when the task labels its own example."""
    inputs, task_labels = task.analysis_example(split)
    labels = None
    if type(task).analysis_example is not Task.analysis_example or decode is None:
        labels = task_labels          # the task labels its own example (symbols, words ...)
    return inputs, labels, f"the first suitable example of the `{split}` split of the run's task (`Task.analysis_example`)"


def _ablation_metric(task, task_error, config, split):
    """(metric(model) -> float or None, its name, the sentence that explains it in the report)."""
    if task is None:
        return None, None, (f"Ablation metric: the cross-entropy on the report's own input (the run's data could "
                            f"not be loaded: {task_error}); lower is better.")
    t = config["train"]
    bs = min(int(t.get("eval_batch_size") or t["batch_size"]), ABLATION_BATCH_SIZE)

    def metric(m):
        return evaluate_loss(m, task, split, bs, max_batches=ABLATION_BATCHES)

    text = (f"Ablation metric: the run's {'validation' if split == 'val' else split} loss, the mean "
            f"cross-entropy per target token over a fixed sample of {ABLATION_BATCHES} × {bs} sequences "
            f"spread over the `{split}` split of the run's task ({task.describe()}; seed 0, the same "
            f"sequences for every head); lower is "
            f"better, so a positive change means the head helps.")
    return metric, f"{split} loss", text


def _occlusion_ids(toks, kind):
    """The id that occlusion puts in place of a token (``<unk>``; None: the report's default, the
    padding id or else 0): per input for a Transformer, else one id."""
    if toks is None:
        return None
    occ = {n: getattr(t, "unk_id", None) for n, t in toks.items()}
    occ = {n: v for n, v in occ.items() if v is not None} or None
    if occ is not None and kind != "transformer":
        occ = next(iter(occ.values()))
    return occ


def _annotate(path, run_dir, how, metric_text):
    """Say in report.md where the run and the input came from, and what the ablation metric is."""
    md = path.read_text(encoding="utf-8").split("\n")
    md[1:1] = ["", f"Run folder: `{run_dir}`. Input: {how}."]
    text = "\n".join(md)
    if metric_text:
        text = text.replace("## Head ablation\n\n", f"## Head ablation\n\n{metric_text}\n\n", 1)
    path.write_text(text, encoding="utf-8")
