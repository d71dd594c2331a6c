"""numformer translate RUN_DIR ["Ein Mann fährt Fahrrad." ...] [--file FILE] [--beam K | --greedy]
[--length-penalty L] [--max-length N]: translate sentences with a trained encoder-decoder Transformer (e.g. the
multi30k run)."""
from __future__ import annotations

import sys


def run(args):
    from ..data.text_tasks import translate_texts
    from ..train.inference import load_translator, unknown_words

    texts = list(args.text)
    from_file = len(texts)                 # texts[from_file:] are the lines of --file
    if args.file:
        try:
            if args.file == "-":
                texts += [line.rstrip("\n") for line in sys.stdin]
            else:
                with open(args.file, encoding="utf-8") as f:
                    texts += [line.rstrip("\n") for line in f]
        except OSError as e:
            raise ValueError(f"cannot read --file {args.file}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            name = "standard input" if args.file == "-" else args.file
            raise ValueError(f"--file {name} is not UTF-8 text ({e.reason} at byte {e.start}); convert it, e.g. "
                             f"iconv -f latin1 -t utf-8") from None
    if not texts:
        raise ValueError('nothing to translate: give a sentence, e.g. numformer translate RUN_DIR '
                         '"Ein Mann fährt Fahrrad.", or --file FILE')
    for i, t in enumerate(texts):
        if not t.strip() and i >= from_file:
            name = "standard input" if args.file == "-" else f"--file {args.file}"
            raise ValueError(f"line {i - from_file + 1} of {name} is empty: one sentence per line, no blank lines")
        if not t.strip():
            where = "" if len(texts) == 1 else f" (number {i + 1})"
            raise ValueError(f"empty input{where}: give a sentence to translate, e.g. "
                             f"numformer translate {args.run_dir} \"Ein Mann fährt Fahrrad.\"")
    if args.beam is not None and args.beam < 1:
        raise ValueError(f"--beam must be >= 1, got {args.beam}")
    if args.max_length is not None and args.max_length < 1:
        raise ValueError(f"--max-length must be at least 1 (target tokens), got {args.max_length}")
    model, src_tok, tgt_tok, config = load_translator(args.run_dir)
    data = config.get("data", {})
    beam = 1 if args.greedy else (args.beam if args.beam is not None else int(data.get("beam_size", 4)))
    lp = args.length_penalty if args.length_penalty is not None else float(data.get("length_penalty", 1.0))
    for t in texts:
        unk = unknown_words(src_tok, t)
        if unk:
            print(f"note: not in the source vocabulary, read as <unk>: {', '.join(unk)}", file=sys.stderr)
    hyps = translate_texts(model, src_tok, tgt_tok, texts, beam_size=beam, length_penalty=lp,
                           max_length=args.max_length, max_src_len=data.get("max_len"))
    for h in hyps:
        print(h)


def register(sub):
    p = sub.add_parser("translate", help="translate sentences with a trained encoder-decoder Transformer")
    p.add_argument("run_dir", help="a run folder written by `numformer train` or `numformer reproduce multi30k` "
                                   "(runs/multi30k)")
    p.add_argument("text", nargs="*", help="sentences to translate (one output line each)")
    p.add_argument("--file", default=None,
                   help="also translate each line of FILE ('-' reads standard input); a blank line is refused")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--beam", type=int, default=None, help="beam size (default: the run's [data] beam_size, else 4)")
    g.add_argument("--greedy", action="store_true", help="greedy decoding (the same as --beam 1)")
    p.add_argument("--length-penalty", type=float, default=None,
                   help="beam score = log-probability / length ** LENGTH_PENALTY (default: the run's [data] "
                        "length_penalty, else 1.0)")
    p.add_argument("--max-length", type=int, default=None,
                   help="most target tokens per sentence, 1 to the model's max_len (default: 1.5 × the longest "
                        "source of its batch + 10, at most max_len)")
    p.set_defaults(func=run)
