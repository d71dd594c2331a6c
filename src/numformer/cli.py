"""The ``numformer`` command.

Each sub-command lives in its own module under ``numformer.commands`` and
defines ``register(subparsers)``, which adds its parser and sets ``func``.
Modules are imported when the CLI starts, so keep their top-level imports light
(import NumPy-heavy code inside the command's function).

Errors: every expected failure (bad input, a file that cannot be read or
written, a full disk, a folder in use, too little memory, a diverged run) is
one line ``numformer COMMAND: error: ...`` on stderr and exit code 2 (a
command line argparse refuses: its usage, then that line); Ctrl-C exits with
130 without a traceback (``numformer chat`` in a terminal: it stops the reply
being written), and an output pipe closed early (``| head``) with 141.
Only an unexpected exception (a bug) prints a traceback, followed by a line
asking to report it (exit code 1).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import pkgutil
import sys
import traceback

from . import __version__, commands

EXIT_ERROR, EXIT_INTERRUPTED, EXIT_BUG, EXIT_BROKEN_PIPE = 2, 130, 1, 141     # 141: as SIGPIPE


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of a value not among an argument's choices (a misspelt command or
    ``--split tset``) names the nearest choice (``nearest_name``). Sub-commands' parsers are of this class too
    (``add_subparsers`` makes them of its parser's class)."""

    def _check_value(self, action, value):
        choices = action.choices
        if (choices is not None and isinstance(value, str) and value not in choices
                and all(isinstance(c, str) for c in choices)):
            guess = nearest_name(value, list(choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}"
                                         + (f"; did you mean {guess}?" if guess else "")
                                         + f" (choose from {', '.join(choices)})")
        super()._check_value(action, value)


def build_parser():
    parser = _Parser(prog="numformer", description="A complete Transformer library in NumPy.")
    parser.add_argument("--version", action="version", version=f"numformer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def parse_arguments(parser, argv=None):
    """The parsed command line; an argument the command does not know is the command's own error (its usage,
    ``numformer COMMAND: error: ...``, and what it was probably meant to be: ``_flag_hint``), not the top-level
    one, and comes before a missing required argument (a misspelt --out is named, not reported as --out
    missing)."""
    if any(a in ("-h", "--help") for a in (sys.argv[1:] if argv is None else argv)):
        return parser.parse_args(argv)          # the help shows the required arguments as required
    args, unknown = _parse_leniently(parser, argv)
    if unknown:
        command = _innermost_parser(parser, args)
        hints = "".join(_flag_hint(u, command, parser) for u in unknown)
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hints}")
    return parser.parse_args(argv)


def _parse_leniently(parser, argv):
    """``parse_known_args`` with no argument required (restored after): the arguments it does not know, whether
    or not a required one is missing."""
    parsers, changed = [parser], []
    while parsers:
        p = parsers.pop()
        for item in [*p._actions, *p._mutually_exclusive_groups]:
            if item.required:
                changed.append(item)
                item.required = False
            if isinstance(item, argparse._SubParsersAction):
                parsers.extend(item.choices.values())
    try:
        return parser.parse_known_args(argv)
    finally:
        for item in changed:
            item.required = True


def _flag_hint(unknown, command, parser):
    """What an option ``unknown`` (maybe ``--flag=value``; a value gets "") that ``command`` (``parser`` or one of
    its sub-commands' parsers) does not have was probably meant to be: the other commands that have it, else
    the nearest option of ``command`` (``nearest_name``), else the nearest option of another command."""
    if not unknown.startswith("-"):
        return ""
    flag, commands = unknown.split("=", 1)[0], _commands(parser)
    here, own = next((name, flags) for name, p, flags in commands if p is command)
    others = [(name, flags) for name, p, flags in commands if p is not command]
    not_here = f", not of {here}" if here else ""

    def having(f):
        return ", ".join(name for name, flags in others if f in flags)

    if having(flag):
        return f"; {flag} is an option of {having(flag)}{not_here}"
    guess = nearest_name(flag, own)
    if guess:
        return f"; did you mean {guess} for {unknown}?"
    guess = nearest_name(flag, sorted({f for _, flags in others for f in flags}))
    return f"; did you mean {guess} for {unknown}? (an option of {having(guess)}{not_here})" if guess else ""


def _commands(parser):
    """[(command as typed after the program's name: "" for ``parser`` itself, "generate", "exercises check"; its
    parser; its long options)] for ``parser`` and every sub-command under it."""
    found, todo = [], [parser]
    while todo:
        p = todo.pop(0)
        if any(p is q for _, q, _ in found):     # a command's alias
            continue
        flags = [f for a in p._actions for f in a.option_strings if f.startswith("--")]
        found.append((p.prog.removeprefix(parser.prog).strip(), p, flags))
        todo.extend(c for a in p._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices.values())
    return found


def nearest_name(word, names):
    """The name of ``names`` nearest to ``word`` by edit distance (``edit_distance``; leading dashes, which
    options all share, left out), if it is near enough to be what was meant: at most a third of the word's
    letters apart (one for a short word, three at most); None otherwise. The first of equally near names."""
    bare = word.lstrip("-")
    limit = max(1, min(3, len(bare) // 3))
    best = min(names, key=lambda n: edit_distance(bare, n.lstrip("-")), default=None)
    return best if best is not None and edit_distance(bare, best.lstrip("-")) <= limit else None


def edit_distance(a, b):
    """The number of single-letter insertions, deletions, substitutions and swaps of two neighbours that turn
    ``a`` into ``b`` (the optimal string alignment distance: ``--otu`` is one swap from ``--out``)."""
    before, row = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        new = [i]
        for j, cb in enumerate(b, 1):
            new.append(min(row[j] + 1, new[j - 1] + 1, row[j - 1] + (ca != cb)))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                new[j] = min(new[j], before[j - 2] + 1)
        before, row = row, new
    return row[-1]


def _innermost_parser(parser, args):
    """The parser of the (sub-)command the arguments chose: ``numformer exercises check`` -> its ``check``."""
    while True:
        chooser = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if chooser is None or getattr(args, chooser.dest, None) not in chooser.choices:
            return parser
        parser = chooser.choices[getattr(args, chooser.dest)]


def main(argv=None):
    try:                            # building the parser imports the experiments: Ctrl-C may come here already
        parser = build_parser()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    if not (sys.argv[1:] if argv is None else argv):      # plain `numformer`: what it can do, not an error
        parser.print_help()
        return 0
    args = parse_arguments(parser, argv)
    try:
        _set_up_runtime(args)
        check_text_arguments(args)
        with _reading(args):
            result = args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C, or a second stop signal of a run (128 + that signal's number)
        print(file=sys.stderr)
        return 128 + e.signum if hasattr(e, "signum") else EXIT_INTERRUPTED
    except BrokenPipeError:         # the reader of the output went away (`numformer data list | head`)
        from numformer._platform import point_at_null_device
        point_at_null_device(sys.stdout)
        return EXIT_BROKEN_PIPE
    except Exception as e:          # noqa: BLE001 -- sorted into expected failures and bugs
        message = error_message(e)
        if message is None:
            traceback.print_exc()
            print(f"numformer {args.command}: internal error ({type(e).__name__}): this is a bug in numformer; "
                  f"please report it with the traceback above and the command you ran", file=sys.stderr)
            return EXIT_BUG
        print(f"numformer {args.command}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    return 0 if result is None else int(result)


def _set_up_runtime(args):
    """The process's runtime settings for the command (``set_fast_runtime``; bench sets up and compares the modes
    itself), made inside ``main``'s error handling, which also reads the thread count here: a bad
    ``NUMFORMER_NUM_THREADS`` is then the command's one error line, whatever the command."""
    from numformer._runtime import get_num_threads, set_fast_runtime

    if args.command == "bench":
        get_num_threads()
        return
    # Token-by-token generation is matrix-vector work, where the BLAS's own threads measured fastest
    # (`numformer bench hf-generate`: 42.4 against 24.2 tokens/s at batch 1 for numformer's row split).
    set_fast_runtime(blas="native" if args.command in ("generate", "chat") else "numformer")


TEXT_ARGUMENTS = ("text", "texts", "prompt", "src", "tgt", "system")    # the arguments that are text to encode


def check_text_arguments(args):
    """A text argument must be UTF-8: Python gives a byte it cannot decode (``$'ein \\xff mann'``) to the
    program as a lone surrogate, which no tokenizer can encode."""
    for name in TEXT_ARGUMENTS:
        values = getattr(args, name, None)
        for i, value in enumerate([values] if isinstance(values, str) else values or ()):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                byte = value[e.start].encode("utf-8", "surrogateescape")
                label = "--" + name if name in ("prompt", "src", "tgt", "system") or args.command == "analyze" else name
                where = f"{label}" + (f" number {i + 1}" if not isinstance(values, str) and len(values) > 1 else "")
                raise ValueError(f"{where} is not UTF-8 text (byte 0x{byte[0]:02x} at position {e.start}); give "
                                 f"the text in UTF-8 (your terminal's encoding may be another)") from None


def error_message(e):
    """The one-line message for an expected failure, or None for an unexpected one (a bug)."""
    from numformer._install import MissingDependency
    from numformer.train import TrainingDiverged
    from numformer.train.parallel import DataParallelError

    if isinstance(e, OSError):
        text = _os_error(e)
    elif isinstance(e, MemoryError):
        text = (f"out of memory ({e or 'an allocation failed'}); use smaller sizes "
                f"(batch_size, --max-new-tokens, the model) or a machine with more memory")
    elif isinstance(e, (ValueError, TrainingDiverged, DataParallelError, MissingDependency)):
        text = str(e)
    else:
        return None
    return " ".join(text.split()) or type(e).__name__


_OS_HINTS = {
    errno.ENOSPC: "the disk is full; free some space and run again (files written before are intact)",
    errno.EDQUOT: "the disk quota is exceeded; free some space and run again (files written before are intact)",
    errno.EROFS: "the file system is read-only; choose a writable folder",
    errno.EACCES: "permission denied; choose a folder you can write to, or fix its permissions",
    errno.EPERM: "operation not permitted; choose a folder you can write to",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder, not a file",
    errno.ENOENT: "no such file or folder",
}


def _os_error(e):
    if e.errno is None:               # raised with a message of its own (a missing data set ...)
        return str(e)
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = _OS_HINTS.get(e.errno, e.strerror or str(e))
    return f"{where}: {what}" if where else f"{what} ({e.strerror or e})"


@contextlib.contextmanager
def _reading(args):
    """Commands that read a run folder (``run_dir``) hold its shared lock, so that no training writes it
    meanwhile (``numformer.train.run_folder``)."""
    run_dir = getattr(args, "run_dir", None)
    if run_dir is None or args.command == "train":
        yield
        return
    from pathlib import Path

    from numformer.train.run_folder import RunLock

    if not Path(run_dir).is_dir():      # the command itself says what is wrong with it
        yield
        return
    with RunLock(run_dir, exclusive=False, what="read"):
        yield


if __name__ == "__main__":
    sys.exit(main())
