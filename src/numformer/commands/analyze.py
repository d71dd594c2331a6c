"""numformer analyze RUN_DIR [--text TEXT | --src TEXT [--tgt TEXT]] [--out DIR] [--overwrite] [--no-ablation]
[--no-occlusion] [--split val|test]: look inside a trained model; writes report.md and PNG figures.

The report (``numformer.analysis.write_report``) holds the attention maps of every layer and
head with token labels, per-head statistics, the head ablation grid, position importance
(gradient × input and occlusion), the loss and learning-rate curves of ``metrics.jsonl``, the
positional-encoding tables and the block diagram.

The report is built by ``numformer.analysis.analyze_run`` (see there for the input and the
head ablation metric).
"""
from __future__ import annotations

from pathlib import Path


def run(args):
    from ..analysis import analyze_run

    _refuse_a_run_folder(args.out)
    path = analyze_run(args.run_dir, out=args.out, text=args.text, src=args.src, tgt=args.tgt,
                       ablation=not args.no_ablation, occlusion=not args.no_occlusion, split=args.split,
                       overwrite=args.overwrite)
    print(f"report written to {path}")


def _refuse_a_run_folder(out):
    """A report is never written into a run folder, even with --overwrite (as export never writes into one): its
    files would mix with the run's, which a run training there is writing."""
    from ..train import run_folder

    if out is not None and Path(out).is_dir() and run_folder.holds_run(out):
        raise ValueError(f"--out {out} holds a numformer run; an analysis report is never written into a run "
                         f"folder: choose another --out (the default is RUN_DIR/report)")


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
    p.add_argument("--out", default=None, metavar="DIR",
                   help="report folder (default RUN_DIR/report): new, empty, or an earlier report's")
    p.add_argument("--overwrite", action="store_true",
                   help="write the report into a --out folder that holds other files (files of the same names are "
                        "replaced)")
    p.add_argument("--no-ablation", action="store_true", help="skip the head ablation (one evaluation per head)")
    p.add_argument("--no-occlusion", action="store_true",
                   help="skip occlusion (one forward pass per input position)")
    p.add_argument("--split", default="val", choices=["val", "test"],
                   help="split for the default example and the ablation loss (default val)")
    p.set_defaults(func=run)
