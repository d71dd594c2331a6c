"""numformer explore SOURCE [--prompt TEXT] [--port N] [--static OUT.html] [--max-new-tokens N] [--temperature T]
[--top-k K] [--top-p P] [--greedy] [--seed S]: look inside a GPT in the browser (``numformer.explorer``).

SOURCE: a run folder, a Hugging Face folder or a hub id (``hf:gpt2``), loaded as ``numformer generate`` loads
it. Without --static, serves the explorer page on http://127.0.0.1:PORT/ (this computer only) until Ctrl-C;
with --static OUT.html, writes a self-contained page of one prompt (its data embedded: no server, no network).
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_PORT = 8000
STATIC_NEW_TOKENS = 20         # tokens a static page steps through when --max-new-tokens is not given (fewer
                               # where the model's context has no room for them)


def run(args):
    from ..explorer import Explorer, make_server, page_data, prompt_ids, write_static_page
    from ..explorer.page import check_static_path
    from .generate import check_sampling_arguments, load_generator

    check_sampling_arguments(args)
    static = args.static is not None
    if static and args.prompt is None:
        raise ValueError("--static writes the page of one prompt; give it with --prompt TEXT")
    if static and args.port is not None:
        raise ValueError("--port is the server's; --static writes a file and serves nothing: give one of them")
    if static:
        check_static_path(args.static)                  # before anything is computed
    temperature = 1.0 if args.temperature is None else args.temperature
    sampling = {"temperature": 0.0 if args.greedy else temperature, "top_k": args.top_k, "top_p": args.top_p}
    model, tokenizer = load_generator(args.run_dir, command="explore")
    new_tokens = args.max_new_tokens if args.max_new_tokens is not None else STATIC_NEW_TOKENS if static else 0
    ids, n_prompt = None, 0
    if args.prompt is not None:
        ids, n_prompt = prompt_ids(model, tokenizer, args.prompt, new_tokens, seed=args.seed,
                                   fit=args.max_new_tokens is None, **sampling)
    data = page_data(model, tokenizer, ids, n_prompt, args.run_dir, "static" if static else "server", sampling,
                     inline_logits=True if static else None)
    if static:
        made = [p for p in args.static.parents if not p.exists()][:1]       # the deepest folder mkdir makes
        path = write_static_page(args.static, data)
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB, {len(ids)} tokens"
              f"{''.join(f'; made the folder {p}' for p in made)}): open it in a browser")
        return None
    server = make_server(Explorer(model, tokenizer, seed=args.seed), DEFAULT_PORT if args.port is None
                         else args.port, data)
    print(f"numformer explore: {args.run_dir} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return None


def register(sub):
    p = sub.add_parser("explore", help="look inside a GPT in the browser: attention, next-token distribution, "
                                       "logit lens (a local page, or a static file)")
    p.add_argument("run_dir", metavar="SOURCE", help="a run folder, a Hugging Face folder or a hub id (hf:gpt2)")
    p.add_argument("--prompt", default=None, help="open the page with this text analysed (needed with --static)")
    p.add_argument("--port", type=int, default=None,
                   help=f"serve on http://127.0.0.1:PORT/ (default {DEFAULT_PORT}; 0: any free port, printed)")
    p.add_argument("--static", metavar="OUT.html", type=Path, default=None,
                   help="write a self-contained page of --prompt (data embedded, no server) instead of serving: a "
                        "new .html file (its missing folders made, as train's --out), or a page written this way "
                        "before, which is replaced")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens generated after the prompt, to step through (default {STATIC_NEW_TOKENS} with "
                        f"--static, or fewer where the model's context holds fewer; else 0: the page's 'next "
                        f"token' button samples more)")
    p.add_argument("--temperature", type=float, default=None,
                   help="softmax temperature of the generated tokens and the page's starting value (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: smallest set with probability >= p")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (temperature 0)")
    p.add_argument("--seed", type=int, default=None, help="random seed of the generated tokens")
    p.set_defaults(func=run)
