"""``write_report``: every analysis of a model on one input, as report.md plus PNG figures.

The command ``numformer analyze RUN_DIR --text ...`` only has to load the model
and tokenizer of a run and call::

    write_report(out_dir, model, text=text, encode=tok.encode, decode_tokens=tok.tokens,
                 metrics_path=run_dir / "metrics.jsonl", metric=val_loss, metric_name="val_loss")
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .._results import REPORT_FIGURES
from ..models import EncoderClassifier, Transformer
from ._common import as_inputs, input_names, max_lengths, pad_ids
from .ablation import head_ablation, loss_metric, plot_head_ablation
from .attention import GROUP_TITLES, attention_maps
from .curves import plot_eval_metrics, plot_learning_rate, plot_loss_curves, read_metrics
from .diagram import format_model_diagram, plot_model_diagram
from .positional import (plot_position_similarity, plot_positional_encoding, plot_wavelengths,
                         positional_tables)
from .saliency import gradient_x_input, plot_position_importance
from .saliency import occlusion as occlusion_scores
from .stats import format_head_statistics, head_statistics, plot_head_statistics


def _per_input(fn, names):
    """A callable, a tuple of callables (one per input) or a dict -> {input name: callable or None}."""
    if fn is None:
        return {n: None for n in names}
    if isinstance(fn, dict):
        return {n: fn.get(n) for n in names}
    if isinstance(fn, (tuple, list)):
        if len(fn) != len(names):
            raise ValueError(f"give one function per input {names}, got {len(fn)}")
        return dict(zip(names, fn))
    return {n: fn for n in names}


def _resolve_inputs(model, inputs, text, encode):
    names = input_names(model)
    if inputs is None:
        if text is None:
            raise ValueError("write_report needs token ids (inputs=...) or text=... with encode=...")
        texts = (text,) if isinstance(text, str) else tuple(text)
        if len(texts) != len(names):
            raise ValueError(f"{type(model).__name__} reads {len(names)} sequences {names}: give text as "
                             f"{'a string' if len(names) == 1 else 'a (source, target) pair'}")
        encoders = _per_input(encode, names)
        if any(encoders[n] is None for n in names):
            raise ValueError("text=... needs encode=... (a function text -> list of ids)")
        inputs = {n: np.asarray(encoders[n](t), dtype=np.int64) for n, t in zip(names, texts)}
    inputs = as_inputs(model, inputs)
    notes = []
    for n, limit in max_lengths(model).items():
        if inputs[n].shape[0] > 1:
            inputs[n] = inputs[n][:1]
            notes.append("Only the first sequence of the batch is analysed.")
        if limit is not None and inputs[n].shape[1] > limit:
            notes.append(f"The input `{n}` had {inputs[n].shape[1]} tokens; the first {limit} (the model's "
                         f"maximum length) are analysed.")
            inputs[n] = inputs[n][:, :limit]
        if inputs[n].shape[1] == 0:
            raise ValueError(f"the input {n!r} is empty")
    return inputs, notes


def _labels(inputs, tokens, decode_tokens):
    names = list(inputs)
    decoders = _per_input(decode_tokens, names)
    out = {}
    for n in names:
        ids = [int(i) for i in inputs[n][0]]
        if tokens is not None and n in tokens:
            labels = list(tokens[n])
        elif decoders.get(n) is not None:
            labels = [str(t) for t in decoders[n](ids)]
        else:
            labels = [str(i) for i in ids]
        if len(labels) != len(ids):
            raise ValueError(f"{len(labels)} token labels for {len(ids)} ids of input {n!r}")
        out[n] = labels
    return out


def _code(text):
    return "```\n" + text + "\n```"


def _md_escape(s):
    return (str(s).replace("|", "\\|").replace("`", "'").replace("\r", "\\r").replace("\n", "\\n")
            .replace("\t", "\\t"))


def write_report(out_dir, model, inputs=None, *, text=None, encode=None, decode_tokens=None, tokens=None,
                 metrics_path=None, metric=None, metric_name=None, target=None, occlusion_id=None,
                 ablation=True, occlusion=True, max_positions=512, title=None):
    """Write ``out_dir/report.md`` and its figures; return the path of report.md.

    model: a GPT, EncoderClassifier or Transformer (its weights as trained).
    inputs: token ids ((T,) or a dict / (src, tgt) pair for a Transformer; only the first row of a batch is
    analysed, cut to the length of the model's position table when it has one), or
    text: a string (a (source, target) pair for a Transformer) with
    encode: text -> ids (one function, or one per input as a tuple/dict);
    decode_tokens: ids -> list of token strings, for the axis labels (same forms as encode);
    tokens: {input name: labels}, instead of decode_tokens.
    metrics_path: a run's metrics.jsonl, for the loss and learning-rate curves (skipped if None or missing).
    metric: callable(model) -> float for the head ablation (e.g. the validation loss; lower or higher
    is better as the caller knows); default: the cross-entropy on the report's own input
    (``ablation.loss_metric``). ablation=False skips the ablation (it runs the metric once per head).
    target: the score explained by the position importance (see ``saliency``); default the arg-max
    logit at the last position (GPT, Transformer) or the predicted class (EncoderClassifier).
    occlusion_id: the id that replaces a token for occlusion (default the pad id, else 0, a real
    token, which the report says; pass ``<unk>``'s id when the vocabulary has one). occlusion=False skips it (it runs one forward pass
    per input position, the slowest part on long inputs).
    max_positions: rows of the positional tables drawn.
    title: the report's heading (default ``"Analysis report: <model class>"``).
    Figures an earlier report left in ``out_dir`` that this one does not draw are removed.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs, notes = _resolve_inputs(model, inputs, text, encode)
    labels = _labels(inputs, tokens, decode_tokens)
    md = _input_section(model, inputs, labels, notes, title)
    md += _model_section(out, model, inputs)
    maps = attention_maps(model, inputs)
    md += _attention_sections(out, maps, labels)
    if ablation:
        md += _ablation_section(out, model, inputs, metric, metric_name)
    md += _importance_section(out, model, inputs, labels, target, occlusion, occlusion_id, decode_tokens)
    if metrics_path is not None:
        md += _curves_section(out, metrics_path)
    md += _positional_section(out, model, max_positions)
    path = out / "report.md"
    path.write_text("\n".join(md), encoding="utf-8")
    _remove_stale_figures(out, md)
    return path


def _remove_stale_figures(out, md):
    """Remove the figures (``REPORT_FIGURES``) of an earlier report into ``out`` that this one did not draw (a
    section left out, a model without that input), so that the folder holds this report's alone."""
    drawn = set(re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", "\n".join(md)))
    for pattern in REPORT_FIGURES:
        for figure in out.glob(pattern):
            if figure.name not in drawn:
                figure.unlink()


# -- the report's sections: each draws its figures into ``out`` and returns its markdown lines --------------
def _input_section(model, inputs, labels, notes, title):
    names = list(input_names(model))
    kind = type(model).__name__
    md = [f"# {title or f'Analysis report: {kind}'}", "",
          f"{kind} with {model.num_parameters():,} parameters. Input" + ("s" if len(names) > 1 else "") + ":", ""]
    for n in names:
        shown = "".join(labels[n]) if all(len(t) <= 1 for t in labels[n]) else " ".join(labels[n])
        md.append(f"- `{n}` ({inputs[n].shape[1]} tokens): `{_md_escape(shown[:500])}`")
    return md + [""] + [f"> {n}" for n in dict.fromkeys(notes)] + ([""] if notes else [])


def _model_section(out, model, inputs):
    names = list(input_names(model))
    S = inputs[names[0]].shape[1]
    tgt_len = inputs[names[-1]].shape[1] if isinstance(model, Transformer) else None
    plot_model_diagram(model, 1, S, tgt_len, path=out / "model_diagram.png")
    return ["## Model", "", "![block diagram](model_diagram.png)", "",
            _code(format_model_diagram(model, 1, S, tgt_len)), ""]


def _attention_sections(out, maps, labels):
    """The attention maps, and the head statistics computed from them."""
    md = ["## Attention maps", "",
          "Rows are queries, columns keys; each panel is one (layer, head), scaled to its own maximum; "
          "grey cells are masked out.", ""]
    for g in maps:
        f = f"attention_{g}.png"
        maps.plot(g, tokens=labels, path=out / f)
        md += [f"### {GROUP_TITLES.get(g, g)}", "", f"![{g} attention]({f})", ""]
    md += ["## Head statistics", "",
           "Averaged over queries: entropy in nats (and divided by log of the number of keys each query "
           "may see), mean attention distance Σ_j a_ij |i-j|, and the attention mass on the previous "
           "token (j = i-1), on itself (j = i), on the first token (j = 0) and on the anti-diagonal "
           "(j = T-1-i).", ""]
    for g, st in head_statistics(maps).items():
        f = f"head_stats_{g}.png"
        plot_head_statistics(st, title=GROUP_TITLES.get(g, g), path=out / f)
        md += [f"### {GROUP_TITLES.get(g, g)}", "", f"![{g} head statistics]({f})", "",
               format_head_statistics(st), ""]
    return md


def _ablation_section(out, model, inputs, metric, metric_name):
    if metric is None:
        metric, metric_name = loss_metric(model, inputs), metric_name or "loss on the input"
    result = head_ablation(model, metric, metric_name=metric_name or "metric")
    plot_head_ablation(result, path=out / "head_ablation.png")
    return ["## Head ablation", "",
            f"The {result.metric_name} with each head's output zeroed (`head_mask`), one head at a time; "
            f"intact model: {result.baseline:.6g}.", "", "![head ablation](head_ablation.png)", "",
            result.table(), ""]


def _importance_section(out, model, inputs, labels, target, occlusion, occlusion_id, decode_tokens):
    sal, tgt = gradient_x_input(model, inputs, target, return_target=True)
    measures = {"gradient × input": sal}
    if occlusion:
        measures["occlusion"] = occlusion_scores(model, inputs, tgt, replace_id=occlusion_id)
    desc = _describe_target(model, tgt, decode_tokens, list(input_names(model)))
    plot_position_importance(measures, labels, title=f"position importance for the {desc}",
                             path=out / "position_importance.png")
    return ["## Position importance", "",
            f"Target: the {desc}. Gradient × input is Σ_d ∂s/∂e_td · e_td for the token embedding e_t"
            + (f"; occlusion is s(input) − s(input with token t replaced by "
               f"{_occlusion_ids(model, occlusion_id, decode_tokens)})" if occlusion else "") + ".", "",
            "![position importance](position_importance.png)", ""]


def _curves_section(out, metrics_path):
    if not Path(metrics_path).is_file():
        return ["## Training curves", "", f"No metrics file at `{metrics_path}`.", ""]
    records = read_metrics(metrics_path)
    plot_loss_curves(records, path=out / "loss.png")
    plot_learning_rate(records, path=out / "lr.png")
    md = ["## Training curves", "", f"From `{Path(metrics_path).name}` ({len(records)} records).", "",
          "![loss](loss.png)", "", "![learning rate](lr.png)", ""]
    if plot_eval_metrics(records, path=out / "eval_metrics.png") is not None:
        md += ["![evaluation metrics](eval_metrics.png)", ""]
    return md


def _positional_section(out, model, max_positions):
    """Each positional table with its position similarity, and the sinusoid's wavelengths."""
    md = ["## Positional encoding", ""]
    d_model = model.d_model
    learned_any = None
    for name, (pkind, table) in positional_tables(model, max_positions).items():
        f = f"positional_{name}.png"
        plot_positional_encoding(table, title=f"{name}: {pkind} ({table.shape[0]} positions × {d_model})",
                                 path=out / f)
        fs = f"position_similarity_{name}.png"
        plot_position_similarity(table, title=f"{name}: cosine similarity between positions", path=out / fs)
        md += [f"### `{name}` ({pkind})", "", f"![{name}]({f})", "", f"![{name} similarity]({fs})", ""]
        if pkind == "learned" and learned_any is None:
            learned_any = table
    lengths = [v for v in max_lengths(model).values() if v is not None]
    length = max(lengths) if lengths else None
    plot_wavelengths(d_model, table=learned_any, max_len=min(length, max_positions) if length else None,
                     path=out / "wavelengths.png")
    return md + ["Wavelengths 2π·10000^(2i/d) of the sinusoidal encoding, per dimension pair"
                 + (" (dots: the dominant period of each column of the learned table)" if learned_any is not None
                    else "") + ":", "", "![wavelengths](wavelengths.png)", ""]


def _occlusion_ids(model, occlusion_id, decode_tokens=None):
    """The report's words for the id occlusion puts in place of a token, and why that id, per input."""
    names = input_names(model)
    given = occlusion_id if isinstance(occlusion_id, dict) else {n: occlusion_id for n in names}
    pads, decoders = pad_ids(model), _per_input(decode_tokens, names)
    words = {}
    for n in names:
        i = given.get(n) if given.get(n) is not None else pads[n] if pads[n] is not None else 0
        shown = f"id {i}" + (f" (`{decoders[n]([i])[0]!r}`)" if decoders[n] is not None else "")
        if given.get(n) is None and pads[n] is None:
            # no neutral token to use: id 0 is a real token, so occlusion also measures swapping it in
            shown += ": the vocabulary has no `<unk>` and no padding id, so id 0, a real token, stands in"
        elif given.get(n) is None:
            shown = f"the padding {shown}"
        words[n] = shown
    texts = set(words.values())
    return texts.pop() if len(texts) == 1 else "; ".join(f"{n}: {w}" for n, w in words.items())


def _describe_target(model, tgt, decode_tokens, names):
    if isinstance(model, EncoderClassifier) and hasattr(tgt, "token"):
        return f"logit of class {int(np.asarray(tgt.token).reshape(-1)[0])}"
    if hasattr(tgt, "token") and tgt.token is not None:
        tok = int(np.asarray(tgt.token).reshape(-1)[0])
        dec = _per_input(decode_tokens, names)[names[-1]]
        shown = repr(dec([tok])[0]) if dec is not None else f"id {tok}"
        where = "the last position" if tgt.position == -1 else f"position {tgt.position}"
        return f"logit of {shown} at {where}"
    return tgt.describe() if hasattr(tgt, "describe") else "target score"
