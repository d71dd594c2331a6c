"""The explorer: a web page that shows a GPT at work on a prompt (``numformer explore SOURCE``).

    from numformer.explorer import page_data, prompt_ids, write_static_page
    ids, n_prompt = prompt_ids(model, tokenizer, "ROMEO:", max_new_tokens=20, seed=0)
    write_static_page("explorer.html", page_data(model, tokenizer, ids, n_prompt, "my model", "static"))

The page shows the prompt's tokens; a click on one draws every layer's and head's attention from it, the
next-token distribution there (with temperature, top-k and top-p controls that filter the logits exactly as
``numformer.sampling`` does) and the logit lens (each layer's top tokens); buttons step through generated
tokens. ``data`` computes what it shows (``run_with_cache``, ``analysis.logit_lens``), ``page`` writes the
self-contained HTML page, ``server`` serves it on 127.0.0.1 with a JSON API that analyses new prompts and
samples the next token.
"""
from .data import FORMAT, analyse, page_data, position_logits, prompt_ids
from .page import read_page_data, refresh_static_page, render_page, write_static_page
from .server import Explorer, make_server, serving

__all__ = ["FORMAT", "analyse", "page_data", "position_logits", "prompt_ids", "read_page_data", "refresh_static_page",
           "render_page", "write_static_page", "Explorer", "make_server", "serving"]
