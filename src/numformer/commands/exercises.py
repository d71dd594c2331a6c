"""numformer exercises list|start|check|hint|train: write numformer's ops yourself, graded against its references.

    numformer exercises list                         the exercises, one line each
    numformer exercises start layer_norm --dir ex    writes ex/layer_norm.py: signatures, docstrings, TODOs
    numformer exercises check layer_norm ex/layer_norm.py    grades it step by step (exit 0 when right)
    numformer exercises hint layer_norm              the next hint (never the code)
    numformer exercises train ex/*.py                a GPT trained on your ops, against the library's curve
"""
from __future__ import annotations


def _list(args):
    from ..exercises import EXERCISES

    width = max(map(len, EXERCISES)) + 2
    for exercise in EXERCISES.values():
        print(f"{exercise.name:<{width}}{exercise.summary}")


def _start(args):
    from ..exercises import get, wrap, write_stub

    path = write_stub(args.name, args.dir, overwrite=args.overwrite)
    print(f"wrote {path}: fill in its TODOs, then grade it with\n"
          f"    numformer exercises check {args.name} {path}")
    print(wrap(f"(`numformer exercises hint {args.name}` gives a hint at a time; the derivation is in "
               f"docs/{get(args.name).page})"))


def _check(args):
    from ..exercises import check_file, format_report

    report = check_file(args.name, args.file)
    print(format_report(report, args.file))
    return 0 if report.ok else 1


def _hint(args):
    from ..exercises import next_hint, wrap

    number, count, text = next_hint(args.name, args.dir)
    print(f"Hint {number} of {count} for {args.name}:\n" + wrap(text, "  "))
    if number < count:
        where = "" if args.dir == "." else f" --dir {args.dir}"
        print(f"(`numformer exercises hint {args.name}{where}` again for the next one)")


def _train(args):
    from ..exercises.training import train

    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    if args.every < 1:
        raise ValueError(f"--every must be at least 1 (a line every N steps), got {args.every}")
    return train(args.files, steps=args.steps, model=args.model, every=args.every, overrides=args.set)


def register(sub):
    p = sub.add_parser("exercises", help="write the ops yourself: stubs, a grader, hints, and a GPT on your ops",
                       description=__doc__.split("\n\n", 1)[0])
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the exercises, one line each").set_defaults(func=_list)
    start = actions.add_parser("start", help="write an exercise's stub: signatures, docstrings, TODOs")
    start.add_argument("name", help="the exercise (the op's name in numformer.ops, e.g. layer_norm)")
    start.add_argument("--dir", default=".", help="folder for NAME.py (default: the current folder)")
    start.add_argument("--overwrite", action="store_true", help="replace an existing NAME.py")
    start.set_defaults(func=_start)
    check = actions.add_parser("check", help="grade your file step by step (exit 0 when it is right, 1 when not)")
    check.add_argument("name", help="the exercise")
    check.add_argument("file", help="your Python file")
    check.set_defaults(func=_check)
    hint = actions.add_parser("hint", help="the next hint of an exercise (never the code)")
    hint.add_argument("name", help="the exercise")
    hint.add_argument("--dir", default=".", help="where to remember which hints you saw (default: the current folder)")
    hint.set_defaults(func=_hint)
    train = actions.add_parser("train", help="train a GPT on your ops and compare its loss curve with the library's")
    train.add_argument("files", nargs="+", help="your exercise files (each op in them must pass its check)")
    train.add_argument("--steps", type=int, default=300,
                       help="training steps (default 300; the learning-rate schedule keeps the config's "
                            "train.max_steps)")
    train.add_argument("--model", default="gpt", choices=["gpt", "llama"],
                       help="gpt: configs/shakespeare_char.toml (default); llama: configs/shakespeare_char_llama.toml")
    train.add_argument("--every", type=int, default=25,
                       help="print the losses every EVERY steps (default 25), and at the first and last step and "
                            "the first where the curves part")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a value of the model's config, e.g. model.n_layers=1 (repeatable)")
    train.set_defaults(func=_train)
