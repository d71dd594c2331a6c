"""numformer chat SOURCE [--system TEXT] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--greedy]
[--seed S] [--adapter DIR] [--template-var KEY=VALUE ...] [--chat-template FILE] [--quantize int8 [--group-size G]]:
talk with a chat model in the terminal.

SOURCE: a Hugging Face model folder (``hf download ... --local-dir FOLDER``), a hub id written ``hf:ID``, or a
run folder. Each line you type is a message; the reply streams as it is generated (the key/value cache) and
ends at the model's end-of-turn or eos tokens. The conversation is rendered with the model's own chat
template (``numformer.data.chat``); a model without one (a run folder trained here) gets numformer's plain
default format (``User: ...`` / ``Assistant:``), and a note says so. The oldest turns are dropped when the
conversation no longer fits the model's context; the system prompt stays. ``/reset`` starts over, ``/quit``
(or ``/exit``, or end of input) ends. In a terminal, Ctrl-C while a reply streams stops it (what was printed of
it stays in the conversation) and gives the prompt back; Ctrl-C at the prompt ends the chat (exit code 130).
When stdin is not a terminal, lines are read from it one by one and each reply is printed on stdout (notes go to
stderr), so a chat can be scripted: ``printf 'Hi\\n' | numformer chat DIR`` (there Ctrl-C ends the chat).
What would fail every message (jinja2 missing for the model's template, a system prompt the tokenizer cannot
encode or the context cannot hold, ``--max-new-tokens 0``) is one error at start (exit code 2).

Sampling: the flags you give (with any of --temperature, --top-k, --top-p or --greedy the file is not read, and
the flags left out take generate's defaults), else the settings of the folder's generation_config.json
(do_sample, temperature, top_k, top_p, as transformers uses them: without do_sample it picks the most likely
token; a do_sample that is not true or false is an error), else those of ``numformer generate``. ``--quantize
int8`` replies from int8 weights, as ``numformer generate`` (``numformer.quantize.quantize_model``; what it
quantized goes to stderr).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

COMMANDS = {"/reset": "clears the conversation (the system prompt stays)", "/quit": "ends the chat"}


def load_chat_model(source, args=None):
    """(model, tokenizer, folder) of SOURCE: the one place ``numformer chat`` loads a model (through the
    loading of ``numformer generate``; quantized when ``args`` asks for it with ``--quantize``)."""
    from .generate import (check_quantize_arguments, check_sampling_arguments, load_generator, model_folder,
                           quantizer_for)

    if args is not None:
        check_sampling_arguments(args)
        check_quantize_arguments(args)
    model, tokenizer = load_generator(source, getattr(args, "adapter", None), "chat", quantizer_for(args))
    return model, tokenizer, model_folder(source)


# What transformers' generate() uses for a sampling value a generation_config.json leaves unset or null
# (GenerationConfig._get_default_generation_params).
TRANSFORMERS_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


# generation_config.json settings that change what transformers generates and numformer does not apply, each
# with the value that changes nothing
UNAPPLIED_GENERATION = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_p": None, "typical_p": 1.0,
                        "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "encoder_repetition_penalty": 1.0,
                        "min_new_tokens": None, "min_length": 0, "bad_words_ids": None, "suppress_tokens": None,
                        "begin_suppress_tokens": None, "sequence_bias": None, "forced_bos_token_id": None,
                        "forced_eos_token_id": None, "exponential_decay_length_penalty": None}


def sampling_settings(args, folder, tokenizer=None):
    """({temperature, top_k, top_p, greedy}, the settings of generation_config.json not applied). The flags
    given (any of them replaces the file), else the model's generation_config.json (``model_files``) read as
    transformers reads it (no do_sample: greedy; an unset value takes transformers' default, top_k 50; top_k
    0: no top-k filtering), else for a Hugging Face model transformers' default (greedy) and for a run of
    numformer's generate's (temperature 1). A value transformers would refuse, or a do_sample that is not a
    boolean (transformers would sample for "yes"), is one error naming the file."""
    from ..data.chat import model_files
    from ..interop.sources import is_run_folder

    settings = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "greedy": args.greedy}
    gen = model_files(folder, tokenizer).get("generation_config.json")
    flags = args.greedy or any(v is not None for k, v in settings.items() if k != "greedy")
    if gen is not None and not flags:
        _check_do_sample(gen.get("do_sample"), folder)
        settings = {"greedy": gen.get("do_sample") is not True,
                    **{k: default if gen.get(k) is None else gen[k]
                       for k, default in TRANSFORMERS_SAMPLING_DEFAULTS.items()}}
        _check_generation_config(settings, folder)
        settings["top_k"] = settings["top_k"] or None
    elif not flags and (Path(folder) / "config.json").is_file() and not is_run_folder(folder):
        settings["greedy"] = True                    # transformers' do_sample defaults to False
    if settings["temperature"] is None:
        settings["temperature"] = 1.0
    unapplied = [f"{k} = {gen[k]!r}" for k, neutral in UNAPPLIED_GENERATION.items()
                 if gen is not None and gen.get(k, neutral) not in (neutral, None, [], {})]
    return settings, unapplied


def _generation_config_path(folder):
    """Where the generation_config.json of ``folder`` was read: its own, else the copy its tokenizer.json keeps."""
    path = Path(folder) / "generation_config.json"
    return path if path.is_file() else f"the generation_config.json kept in {Path(folder) / 'tokenizer.json'}"


def _check_do_sample(do_sample, folder):
    """One ValueError naming generation_config.json when its do_sample is neither true, false nor null: transformers
    samples for any value that is true in Python ("yes", "no", 1) while its mode says greedy."""
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"{_generation_config_path(folder)}: do_sample = {do_sample!r} must be true or false (a JSON "
                         f"boolean); fix the file, or pass --greedy or --temperature")


def _check_generation_config(settings, folder):
    """One ValueError naming generation_config.json when a sampling value in it is one transformers refuses."""
    where = _generation_config_path(folder)
    t, k, p = settings["temperature"], settings["top_k"], settings["top_p"]
    if not settings["greedy"] and not (isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
                                        and math.isfinite(t)):
        raise ValueError(f"{where}: temperature = {t!r} must be a number > 0 when do_sample is true; fix the file, "
                         f"or pass --temperature or --greedy")
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
        raise ValueError(f"{where}: top_k = {k!r} must be an integer >= 0; fix the file, or pass --top-k or --greedy")
    if not (isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p <= 1):
        raise ValueError(f"{where}: top_p = {p!r} must be a number in (0, 1]; fix the file, or pass --top-p or "
                         f"--greedy")


def template_variables(pairs):
    """{name: value} of ``--template-var KEY=VALUE`` (a JSON value, else the text itself)."""
    from .._limits import check_bounds

    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--template-var {pair!r}: write KEY=VALUE, e.g. enable_thinking=false")
        check_bounds(value, f"--template-var {key}", max_bytes=1 << 20, hint="give a short JSON value or text")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def chat_format(args, folder, tokenizer=None):
    """The ``ChatFormat`` of the command line (the folder's, its tokenizer's, or ``--chat-template``'s with the
    folder's special tokens), rendered once with the system prompt (``ChatFormat.check``): a template that cannot
    be used (jinja2 missing, not valid Jinja, refusing the system prompt, rendering nothing, a --chat-template
    file that is not UTF-8) is one error at start rather than one per message."""
    from ..data.chat import ChatFormat, read_special_tokens, read_template_file

    variables = template_variables(args.template_var)
    if args.chat_template is not None:
        fmt = ChatFormat(read_template_file(args.chat_template, "--chat-template"),
                         read_special_tokens(folder, tokenizer), variables)
    else:
        fmt = ChatFormat.from_folder(folder, variables, tokenizer)
    fmt.check(args.system)
    return fmt


def check_reply_length(max_new_tokens):
    """``--max-new-tokens`` of chat: at least 1 (``generate`` takes 0, the prompt alone; a reply needs a token)."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1 for chat (a reply of 0 tokens is always empty), got "
                         f"{max_new_tokens}")


def make_session(args):
    """The ``ChatSession`` of the command line, and the note to show when the model has no chat template. What
    would make every message fail is an error here, before the first prompt: the flags, then (a local folder)
    the chat template before the model loads, then the system prompt in the model's vocabulary and context."""
    from ..data.chat import ChatSession, stop_token_ids
    from ..decoding import generate
    from .generate import check_quantize_arguments, check_sampling_arguments

    check_reply_length(args.max_new_tokens)
    check_sampling_arguments(args)
    check_quantize_arguments(args)
    if Path(args.run_dir).is_dir():                # the template is tried before the (slow) model load
        chat_format(args, args.run_dir)
    model, tokenizer, folder = load_chat_model(args.run_dir, args)
    fmt = chat_format(args, folder, tokenizer)
    note = None
    if fmt.is_default:
        note = (f"{args.run_dir} has no chat template: using numformer's plain format (\"User: ...\" / "
                f"\"Assistant:\"); give one with --chat-template FILE")
    sampling, unapplied = sampling_settings(args, folder, tokenizer)
    if unapplied:
        note = "; ".join(filter(None, [note, f"generation_config.json sets {', '.join(unapplied)}, which numformer "
                                             f"does not apply (its replies differ from transformers' there)"]))
    generate(model, [0], 0, **sampling)          # checks the sampling flags once, before the first message
    session = ChatSession(model, tokenizer, fmt, system=args.system, max_new_tokens=args.max_new_tokens,
                          stop_tokens=stop_token_ids(folder, tokenizer, fmt), rng=args.seed, **sampling)
    session.check()
    return session, note


def run(args):
    from .generate import int8_worker_processes

    session, note = make_session(args)
    interactive = sys.stdin.isatty()
    say = (lambda text: print(text, file=sys.stderr))
    if note:
        say(note)
    if interactive:
        say(f"chatting with {args.run_dir}; " + "; ".join(f"{c} {what}" for c, what in COMMANDS.items())
            + "; Ctrl-C stops a reply")
    with int8_worker_processes(session.model, args):
        failed = _converse(session, interactive, say)
    return 2 if failed and not interactive else 0


def _converse(session, interactive, say):
    """Answer the user's lines until /quit or the end of input; whether a message failed."""
    failed = False
    for line in _lines(interactive):
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            session.reset()
            say("(the conversation is cleared)")
            continue
        failed |= not _reply(session, text, say, interactive)
    return failed


def _lines(interactive):
    """The user's lines: prompted with "> " in a terminal, else read from stdin one by one."""
    while True:
        try:
            line = input("> ") if interactive else sys.stdin.readline()
        except EOFError:
            return
        if not interactive and not line:
            return
        yield line


def _reply(session, text, say, interactive):
    """Send one message and stream the reply to stdout; a message that cannot be sent is one line on stderr. In a
    terminal, Ctrl-C stops the reply (what was printed of it stays in the conversation) and the chat goes on."""
    out = sys.stdout

    def stream(piece):
        out.write(piece)
        out.flush()

    try:
        session.send(text, stream=stream)
    except ValueError as e:
        say(f"numformer chat: error: {' '.join(str(e).split())}")
        return False
    except KeyboardInterrupt:
        if not interactive:                         # a scripted chat ends, as any command (exit 130)
            raise
        stopped = True
    else:
        stopped = False
    out.write("\n")
    out.flush()
    if stopped:
        say("(stopped; what was printed of the reply stays in the conversation)")
    if session.dropped:
        say(f"(dropped the {session.dropped} oldest turn(s) to fit the model's context)")
    return True


def register(sub):
    from .generate import add_adapter_argument, add_quantize_arguments, add_sampling_arguments

    p = sub.add_parser("chat", help="talk with a chat model (streams; reads stdin line by line when piped)")
    p.add_argument("run_dir", metavar="SOURCE", help="a Hugging Face model folder, a hub id written hf:ID, or a "
                                                     "run folder")
    p.add_argument("--system", default=None, help="system prompt (kept when old turns are dropped)")
    add_adapter_argument(p)
    add_sampling_arguments(p, max_new_tokens=512,
                           temperature_default="generation_config.json's, with its top_k, top_p and "
                                              "do_sample, when no other sampling flag is given; else 1.0")
    next(a for a in p._actions if a.dest == "max_new_tokens").help = \
        "the most tokens of a reply, at least 1 (default 512; a reply also ends at the model's end-of-turn token)"
    p.add_argument("--template-var", action="append", metavar="KEY=VALUE",
                   help="a chat-template variable, e.g. enable_thinking=false (Qwen3); repeatable")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a Jinja chat template to use instead of the model's")
    add_quantize_arguments(p)
    p.set_defaults(func=run)
