"""numformer generate RUN_DIR --prompt TEXT --max-new-tokens N [--temperature T] [--top-k K] [--top-p P]
[--greedy] [--seed S]: continue a prompt with a trained GPT, printing the text as it comes."""
from __future__ import annotations

import sys


def run(args):
    from ..generate import generate
    from ..train import load_config_json, load_model
    from ..train.run import load_tokenizer

    config = load_config_json(args.run_dir)
    if config["model"]["type"] != "gpt":
        raise ValueError(f"{args.run_dir} holds a {config['model']['type']} model; `numformer generate` continues "
                         f"text with a GPT (use `numformer translate` or `classify` for the others)")
    tokenizer = load_tokenizer(args.run_dir)
    if tokenizer is None:
        raise ValueError(f"{args.run_dir} has no tokenizer.json, so text cannot be encoded")
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one character with --prompt")
    model = load_model(args.run_dir, config)
    out = sys.stdout
    shown = []                        # the prompt is printed with the first token: after every option is checked

    def stream(token):
        if not shown:
            out.write(args.prompt)
            shown.append(True)
        out.write(tokenizer.decode([token]))
        out.flush()

    generate(model, prompt_ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
             top_p=args.top_p, greedy=args.greedy, rng=args.seed, stream=stream)
    out.write(("" if shown else args.prompt) + "\n")


def register(sub):
    p = sub.add_parser("generate", help="continue a prompt with a trained GPT (streams to the terminal)")
    p.add_argument("run_dir", help="a run folder written by `numformer train`")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate (default 500)")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature (default 1.0; 0 = greedy)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: smallest set with probability >= p")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--seed", type=int, default=None, help="random seed, for a repeatable sample")
    p.set_defaults(func=run)
