"""numformer analyze RUN_DIR [--text TEXT | --src TEXT [--tgt TEXT]] [--out DIR] [--no-ablation]
[--no-occlusion] [--split val]: look inside a trained model; writes report.md and PNG figures.

The report (``numformer.analysis.write_report``) holds the attention maps of every layer and
head with token labels, per-head statistics, the head ablation grid, position importance
(gradient × input and occlusion), the loss and learning-rate curves of ``metrics.jsonl``, the
positional-encoding tables and the block diagram.

Input: ``--text`` encoded with the run's saved tokenizer (tokenizer.json); without it, the run's
task gives one example of ``--split`` (``Task.analysis_example``). For an encoder-decoder
Transformer, ``--src`` (or ``--text``) is the source; the target is ``--tgt`` if given, else the
model's own greedy translation of the source.

Head ablation metric: the run's validation loss, the mean cross-entropy per target token over the
first ``ABLATION_BATCHES`` batches of ``--split`` (quick, and the same batches for every head);
where the run's data cannot be loaded, the cross-entropy on the report's own input.
"""
from __future__ import annotations

import sys
from pathlib import Path

ABLATION_BATCHES = 4          # validation batches per ablation evaluation
ABLATION_BATCH_SIZE = 32      # at most this many sequences per batch


# -- tokenizers -----------------------------------------------------------------------------------------------
class SymbolTokenizer:
    """The vocabulary of the synthetic tasks ({"type": "symbols", "tokens": [...]}) as a tokenizer.

    encode: whitespace separates tokens; inside a chunk the longest vocabulary entry is taken first,
    so "0123<sep>3210" and "12 7 99" both work.
    """

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.tokens)}
        self.longest = max(len(t) for t in self.tokens)

    def encode(self, text):
        ids = []
        for chunk in text.split():
            i = 0
            while i < len(chunk):
                for n in range(min(self.longest, len(chunk) - i), 0, -1):
                    if chunk[i:i + n] in self.stoi:
                        ids.append(self.stoi[chunk[i:i + n]])
                        i += n
                        break
                else:
                    shown = ", ".join(self.tokens[:20]) + (" ..." if len(self.tokens) > 20 else "")
                    raise ValueError(f"{chunk[i:]!r} is not in the run's vocabulary ({shown}); write the input "
                                     f"with these tokens, separated by spaces if needed")
        return ids

    def special_id(self, token):
        if token not in self.stoi:
            raise ValueError(f"this vocabulary has no {token} token")
        return self.stoi[token]


def _token_labels(tokenizer, ids):
    """One label per id: the symbol, character, word, or BPE piece (``##piece`` continues a word)."""
    ids = [int(i) for i in ids]
    if hasattr(tokenizer, "hf"):
        out = []
        for i in ids:
            piece = tokenizer.hf.id_to_token(i) or "?"
            if piece.startswith("<") and piece.endswith(">"):
                out.append(piece)
            else:
                text = tokenizer.hf.decode([i], skip_special_tokens=False)
                out.append(text.strip() if piece.startswith("\u0120") else "##" + text.strip())
        return out
    if hasattr(tokenizer, "tokens"):
        return [tokenizer.tokens[i] for i in ids]
    if hasattr(tokenizer, "chars"):
        return [tokenizer.chars[i] for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def _tokenizers(state, kind, run_dir):
    """{input name: tokenizer} for the model's inputs, from tokenizer.json (None: no saved tokenizer)."""
    from ..data.tokenizers import tokenizer_from_dict

    if state is None:
        return None
    if state.get("type") == "symbols":
        tok = SymbolTokenizer(state["tokens"])
        return {"src": tok, "tgt": tok} if kind == "transformer" else {_input_name(kind): tok}
    if "src" in state:
        src = tokenizer_from_dict(state["src"])
        tgt = src if state.get("joint") or not state.get("tgt") else tokenizer_from_dict(state["tgt"])
        return {"src": src, "tgt": tgt}
    if kind == "transformer":
        raise ValueError(f"{run_dir}/tokenizer.json has no source and target tokenizers")
    return {_input_name(kind): tokenizer_from_dict(state)}


def _input_name(kind):
    return {"gpt": "idx", "classifier": "ids", "transformer": "src"}[kind]


def _encode(tokenizer, text, option, cls=False):
    if cls and hasattr(tokenizer, "special_id"):
        ids = tokenizer.encode(text, add_cls=True)
        empty = len(ids) <= 1
    else:
        ids = tokenizer.encode(text)
        empty = not ids
    if empty:
        raise ValueError(f"{option} {text!r} has no tokens after tokenization with the run's tokenizer; "
                         f"give some text the model can read")
    return ids


def _bos_eos(tokenizer):
    from ..data.tokenizers import BOS, EOS

    return tokenizer.special_id(BOS), tokenizer.special_id(EOS)


# -- the command ----------------------------------------------------------------------------------------------
def analyze_run(run_dir, out=None, text=None, src=None, tgt=None, ablation=True, occlusion=True, split="val",
                log=None):
    """Write RUN_DIR's analysis report into ``out`` (default RUN_DIR/report); returns the path of report.md."""
    import numpy as np

    from ..analysis import write_report
    from ..train import evaluate_loss, load_config_json, load_model, load_task, load_tokenizer_state
    from ..train.checkpoint import CHECKPOINT, MODEL

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} does not exist or is not a folder; give a run folder written by "
                         f"`numformer train CONFIG --out RUN_DIR` (or `numformer reproduce NAME`, e.g. runs/copy)")
    config = load_config_json(run_dir)
    kind = config["model"]["type"]
    if not (run_dir / MODEL).is_file():
        if not (run_dir / CHECKPOINT).is_file():
            raise ValueError(f"{run_dir} has no {MODEL} (no weights saved yet); let `numformer train` reach its "
                             f"first evaluation, or continue it with `numformer train --resume --out {run_dir}`")
        log(f"note: {run_dir} has no {MODEL}; using the weights of {CHECKPOINT}")
    if tgt is not None and kind != "transformer":
        raise ValueError(f"--tgt is for encoder-decoder Transformer runs; {run_dir} holds a {kind} model: "
                         f"give its input with --text")
    if src is not None and kind != "transformer":
        raise ValueError(f"--src is for encoder-decoder Transformer runs; {run_dir} holds a {kind} model: "
                         f"give its input with --text")
    if kind == "transformer" and text is not None:
        if src is not None:
            raise ValueError("give the source once: --src (or --text), not both")
        src, text = text, None
    if tgt is not None and src is None:
        raise ValueError("--tgt needs --src: the source sentence the target is read against")

    model = load_model(run_dir, config)
    state = load_tokenizer_state(run_dir)
    toks = _tokenizers(state, kind, run_dir)
    data = config.get("data", {})
    given = text is not None or src is not None
    task, task_error = None, None
    try:
        task = load_task(run_dir, config)
    except (ValueError, OSError, ImportError, KeyError, RuntimeError) as e:
        task_error = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not given:
            option = "--src" if kind == "transformer" else "--text"
            raise ValueError(f"the data of {run_dir} could not be loaded ({task_error}); give an input with "
                             f"{option} TEXT") from None

    # -- the input -------------------------------------------------------------------------------------------
    decode = None
    if toks is not None:
        decode = {n: (lambda ids, t=t: _token_labels(t, ids)) for n, t in toks.items()}
    labels = None
    if given:
        if toks is None:
            raise ValueError(f"{run_dir} has no tokenizer.json, so text cannot be encoded; leave out "
                             f"--text/--src to analyse an example of the run's task")
        if kind == "transformer":
            src_ids = _encode(toks["src"], src, "--src")
            bos, eos = _bos_eos(toks["tgt"])
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
                       f"`{' '.join(_token_labels(toks['tgt'], tgt_ids[1:]))}`")
            inputs = {"src": np.asarray(src_ids, dtype=np.int64), "tgt": np.asarray(tgt_ids[:limit], dtype=np.int64)}
        else:
            cls = kind == "classifier" and bool(data.get("cls_token", False))
            name = _input_name(kind)
            inputs = {name: np.asarray(_encode(toks[name], text, "--text", cls=cls), dtype=np.int64)}
            how = "from --text, encoded with the run's tokenizer" + (" (with `<cls>` first)" if cls else "")
    else:
        from ..data.base import Task

        inputs, task_labels = task.analysis_example(split)
        if type(task).analysis_example is not Task.analysis_example or decode is None:
            labels = task_labels          # the task labels its own example (symbols, words ...)
        how = f"the first suitable example of the `{split}` split of the run's task (`Task.analysis_example`)"

    # -- the ablation metric ---------------------------------------------------------------------------------
    metric, metric_name, metric_text = None, None, None
    if ablation:
        if task is not None:
            t = config["train"]
            bs = min(int(t.get("eval_batch_size") or t["batch_size"]), ABLATION_BATCH_SIZE)

            def metric(m):
                return evaluate_loss(m, task, split, bs, max_batches=ABLATION_BATCHES)

            metric_name = f"{split} loss"
            metric_text = (f"Ablation metric: the run's {'validation' if split == 'val' else split} loss, the mean "
                           f"cross-entropy per target token over the first {ABLATION_BATCHES} batches of at most "
                           f"{bs} sequences of the `{split}` split of the run's task ({task.describe()}); lower is "
                           f"better, so a positive change means the head helps.")
        else:
            metric_text = (f"Ablation metric: the cross-entropy on the report's own input (the run's data could "
                           f"not be loaded: {task_error}); lower is better.")

    occ = None
    if toks is not None:
        occ = {n: getattr(t, "unk_id", None) for n, t in toks.items()}
        occ = {n: v for n, v in occ.items() if v is not None} or None
        if occ is not None and kind != "transformer":
            occ = next(iter(occ.values()))

    out = Path(out) if out is not None else run_dir / "report"
    log(f"analyzing {run_dir} ({kind}, {model.num_parameters():,} parameters) into {out} ...")
    path = write_report(out, model, inputs, decode_tokens=decode, tokens=labels,
                        metrics_path=run_dir / "metrics.jsonl", metric=metric, metric_name=metric_name,
                        occlusion_id=occ, ablation=ablation, occlusion=occlusion,
                        title=f"Analysis report: {run_dir.name} ({kind}, task {data.get('task', '?')})")
    _annotate(path, run_dir, how, metric_text)
    return path


def _annotate(path, run_dir, how, metric_text):
    """Say in report.md where the run and the input came from, and what the ablation metric is."""
    md = path.read_text(encoding="utf-8").split("\n")
    md[1:1] = ["", f"Run folder: `{run_dir}`. Input: {how}."]
    text = "\n".join(md)
    if metric_text:
        text = text.replace("## Head ablation\n\n", f"## Head ablation\n\n{metric_text}\n\n", 1)
    path.write_text(text, encoding="utf-8")


def run(args):
    path = analyze_run(args.run_dir, out=args.out, text=args.text, src=args.src, tgt=args.tgt,
                       ablation=not args.no_ablation, occlusion=not args.no_occlusion, split=args.split)
    print(f"report written to {path}")


def register(sub):
    p = sub.add_parser("analyze", help="look inside a trained model: attention maps, head statistics, "
                                       "ablations, position importance, curves (report.md + PNG figures)")
    p.add_argument("run_dir", help="a run folder written by `numformer train` or `numformer reproduce`")
    p.add_argument("--text", default=None,
                   help="input text, encoded with the run's tokenizer (default: an example of the run's task); "
                        "for a Transformer, the source")
    p.add_argument("--src", default=None, help="Transformer runs: the source text")
    p.add_argument("--tgt", default=None,
                   help="Transformer runs: the target text (default: the model's greedy translation of --src)")
    p.add_argument("--out", default=None, metavar="DIR", help="report folder (default RUN_DIR/report)")
    p.add_argument("--no-ablation", action="store_true", help="skip the head ablation (one evaluation per head)")
    p.add_argument("--no-occlusion", action="store_true",
                   help="skip occlusion (one forward pass per input position)")
    p.add_argument("--split", default="val", choices=["val", "test"],
                   help="split for the default example and the ablation loss (default val)")
    p.set_defaults(func=run)
