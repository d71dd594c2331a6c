"""Chat formats: a conversation rendered into the text a chat model was trained on, and a chat session.

A conversation is a list of messages ``{"role": "system" | "user" | "assistant", "content": text}``.
A chat model ships a Jinja template that turns it into one string with the model's own markers
(Llama 3's ``<|start_header_id|>``, Qwen's ChatML ``<|im_start|>``, Gemma's ``<start_of_turn>`` with the
role ``model``); the token ids are the tokenizer's encoding of that string. ``apply_chat_template``
renders it exactly as transformers' ``tokenizer.apply_chat_template`` does (``transformers.utils.
chat_template_utils``), so the same conversation gives the same string and the same ids:

- a sandboxed Jinja environment (``ImmutableSandboxedEnvironment``; templates come from the internet) with
  ``trim_blocks`` and ``lstrip_blocks`` on and the ``loopcontrols`` extension (``{% break %}``);
- the template sees ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the tokenizer's named
  special tokens (``bos_token``, ``eos_token``, ...) and any extra variables (Qwen3's ``enable_thinking``,
  Llama 3's ``date_string``), which win over the special tokens;
- ``raise_exception(msg)``, ``strftime_now(fmt)``, a ``tojson`` filter that keeps non-ASCII text and takes
  ``indent``, ``separators``, ``sort_keys``; ``dict(...)``, and ``namespace(...)`` refusing names with ``_``;
- ``{% generation %} ... {% endgeneration %}`` marks the assistant's text (``generation_spans`` returns where);
- keys whose value is None are dropped from messages; a message's reasoning given as ``reasoning_content``,
  ``thinking`` or ``reasoning`` is offered under ``reasoning_content`` and ``thinking``.

Where a template is found (``read_chat_template``): ``chat_template.jinja`` and
``additional_chat_templates/*.jinja`` in a model folder win over the ``chat_template`` of
``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}``, or an object of them by name; any
other value is an error naming the file); with several templates the one named "default" is used ("tool_use"
when tools are given), or the one you name.

``ChatSession`` keeps the history of a conversation with a model: each ``send`` renders it, trims the oldest
turns to fit the context, generates the reply with the key/value cache (``decoding.generate``), stops at
the end-of-turn tokens, and streams the text as it comes. Jinja2 is the ``chat`` extra;
numformer's own plain format (``DEFAULT_TEMPLATE``) is rendered without it.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from .._install import install_hint
from .._limits import bounded_json
from ..decoding import generate
from .tokenizers.pretrained import TEMPLATES_DIR, side_files

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# The template of a model that has none (numformer's own runs): plain text, without special tokens.
# A reply ends where the model starts a new turn (DEFAULT_STOP_STRINGS) or at the tokenizer's eos token.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] | trim }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
DEFAULT_STOP_STRINGS = ("\nUser:", "\nSystem:", "\nAssistant:")
# A template that writes nothing for a conversation leaves the model no token to start its reply from.
EMPTY_PROMPT = ("the chat template rendered an empty prompt (no text for the model to continue from); give a "
                "template that writes the conversation's messages, with --chat-template FILE")


def render_default(messages, add_generation_prompt=False):
    """``DEFAULT_TEMPLATE`` rendered in Python, as Jinja renders it (``capitalize``: first letter upper, the
    rest lower; ``trim``: surrounding whitespace off; a missing key renders as ""), so that chatting with a
    model of one's own needs no jinja2. messages: normalized (``_messages``)."""
    turns = (f"{str(m.get('role', '')).capitalize()}: {str(m.get('content', '')).strip()}\n\n" for m in messages)
    return "".join(turns) + ("Assistant:" if add_generation_prompt else "")


# -- the Jinja environment ----------------------------------------------------------------------------------
def _jinja():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise ValueError(f"rendering a chat template needs jinja2, which is not installed: "
                         f"{install_hint('chat', 'jinja2')}") from None
    if tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit()) < (3, 1, 6):
        raise ValueError(f"jinja2 {jinja2.__version__} has known sandbox escapes, and chat templates are untrusted "
                         f"code: pip install -U 'jinja2>=3.1.6'")
    return jinja2


@lru_cache(maxsize=32)
def compile_chat_template(source):
    """The compiled template of ``source`` (cached), in transformers' environment (see the module docstring)."""
    jinja2 = _jinja()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_generation_extension(jinja2),
                                                                   jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception(jinja2), strftime_now=_strftime_now,
                       dict=_TemplateDict(), namespace=_namespace_class(jinja2))
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid Jinja (line {e.lineno}: {e.message})") from None


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def _raise_exception(jinja2):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    return raise_exception


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, without the type itself (no attribute tricks)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _namespace_class(jinja2):
    class TemplateNamespace(jinja2.utils.Namespace):
        """A namespace that refuses names starting with an underscore (no reach into Python's internals)."""

        def __init__(*args, **kwargs):          # Jinja's own signature trick: ``namespace(self=...)`` works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed "
                                                      f"attributes on a namespace, got {name!r}")
    return TemplateNamespace


_TRACKING = ContextVar("numformer_generation_spans", default=None)   # (rendered chunks, spans) while tracking


def _generation_extension(jinja2):
    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body and, while ``generation_spans``
        renders, records where it lands (the length of the text rendered before it)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:
                chunks, spans = tracking
                start = sum(map(len, chunks))
                spans.append((start, start + len(text)))
            return text
    return Generation


# -- rendering -------------------------------------------------------------------------------------------
def _plain(value):
    """Plain JSON-like data for the sandbox (as transformers' ``_plain_template_data``): other objects become
    an inert ``"<TypeName>"``, dataclasses and mappings dicts, tuples stay tuples."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind) and not isinstance(value, bool):
            return kind(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _messages(messages):
    """transformers' normalization: dicts only, None values dropped, reasoning offered under both names."""
    out = []
    for message in messages:
        if dataclasses.is_dataclass(message) and not isinstance(message, type):
            message = _plain(message)
        if not isinstance(message, Mapping):
            raise ValueError(f"a chat message is a dict with 'role' and 'content', got {message!r}")
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def select_chat_template(chat_template, name=None, tools=None):
    """The template source to use. ``chat_template`` a string (or None): itself, or ``name`` when given (taken
    as a template source, as transformers does). A dict of named templates: the one called ``name`` (a name
    not in the dict is taken as a template source), else "tool_use" when tools are given and it exists, else
    "default". No template at all, or a dict without "default", is a ValueError."""
    if not isinstance(chat_template, Mapping):
        if chat_template is None and name is None:
            raise ValueError("there is no chat template: give one (a Jinja string), or a model folder that has one")
        return chat_template if name is None else name
    if name is not None:
        return chat_template.get(name, name)
    if tools is not None and "tool_use" in chat_template:
        return chat_template["tool_use"]
    if "default" not in chat_template:
        raise ValueError(f"the model has several chat templates and none is called 'default'; name one of "
                         f"{sorted(chat_template)}")
    return chat_template["default"]


def apply_chat_template(messages, chat_template, add_generation_prompt=False, tools=None, documents=None,
                        special_tokens=None, template_name=None, **variables):
    """The text of ``messages`` rendered with ``chat_template`` (a Jinja source, or a dict of named ones),
    as transformers' ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` renders it.

    messages: a non-empty list of message dicts (or dataclasses); add_generation_prompt: end with the
    start of the assistant's turn (default False); tools: JSON schemas (dicts) of the tools; documents:
    dicts with "title" and "text"; special_tokens: ``{"bos_token": "<s>", ...}`` (``read_chat_template``
    gives a folder's); template_name: which of several named templates (``select_chat_template``);
    variables: extra template variables (``enable_thinking=False``, ``date_string="26 Jul 2024"``),
    which win over the special tokens. A template that refuses the conversation (``raise_exception``,
    or any other Jinja template error) is a ValueError.
    """
    return _render(messages, chat_template, add_generation_prompt, tools, documents, special_tokens,
                   template_name, variables, spans=None)


def generation_spans(messages, chat_template, add_generation_prompt=False, tools=None, documents=None,
                     special_tokens=None, template_name=None, **variables):
    """(text, [(start, end), ...]): the rendered text and where each ``{% generation %}`` block (the
    assistant's words, in templates that mark them) lies in it; arguments as ``apply_chat_template``."""
    spans = []
    text = _render(messages, chat_template, add_generation_prompt, tools, documents, special_tokens,
                   template_name, variables, spans=spans)
    return text, spans


def _render(messages, chat_template, add_generation_prompt, tools, documents, special_tokens, template_name,
            variables, spans):
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("a conversation is a non-empty list of messages {'role': ..., 'content': ...}")
    if tools is not None and any(not isinstance(t, Mapping) for t in tools):
        raise ValueError("tools must be JSON schemas (dicts); numformer does not build schemas from functions")
    if documents is not None and any(not isinstance(d, Mapping) for d in documents):
        raise ValueError("documents must be a list of dicts with 'title' and 'text' keys")
    source = select_chat_template(chat_template, template_name, tools)
    if not isinstance(source, str):
        raise ValueError(f"the chat template is a {type(source).__name__} ({_shown(source)}), not a string; a chat "
                         f"template is Jinja source text (or a dict of such texts by name)")
    if source == DEFAULT_TEMPLATE:          # numformer's own format needs no Jinja (nor the chat extra)
        return render_default(_messages(messages), add_generation_prompt)
    jinja2 = _jinja()
    template = compile_chat_template(source)
    context = {**_plain(dict(special_tokens or {})), **_plain(variables), "messages": _messages(messages),
               "tools": _plain(tools), "documents": _plain(documents), "add_generation_prompt": add_generation_prompt}
    try:
        if spans is None:
            return template.render(**context)
        chunks = []
        token = _TRACKING.set((chunks, spans))
        try:
            for chunk in template.generate(**context):
                chunks.append(chunk)
        finally:
            _TRACKING.reset(token)
        return "".join(chunks)
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template refused the conversation: {e.message or e}") from None


# -- a model folder's template and special tokens ---------------------------------------------------------------
def _token_text(value):
    """A special token as tokenizer_config.json stores it: a string, or an AddedToken dict with "content"."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def model_files(folder, tokenizer=None):
    """The side files of the model in ``folder`` (``SIDE_FILES``: tokenizer_config.json, generation_config.json,
    chat templates ...): the folder's own, else those its tokenizer carries (``PretrainedTokenizer.files``: a run
    folder made from a Hugging Face model keeps them in its tokenizer.json); {name: JSON object or text}."""
    return {**getattr(tokenizer, "files", {}), **side_files(folder)}


def read_chat_template(folder, tokenizer=None):
    """(template or None, special tokens {"bos_token": ..., ...}) of a model folder (``model_files``), read as
    transformers' ``AutoTokenizer.from_pretrained`` reads them (see the module docstring); the template is a
    string, or a dict of named templates. A ``chat_template`` in tokenizer_config.json that is neither a string
    nor a list of named templates is one ValueError naming the file."""
    files = model_files(folder, tokenizer)
    templates = {}
    if "chat_template.jinja" in files:
        templates["default"] = files["chat_template.jinja"]
    for name in sorted(files):
        if name.startswith(TEMPLATES_DIR + "/"):
            templates[name[len(TEMPLATES_DIR) + 1:].removesuffix(".jinja")] = files[name]
    if templates:
        template = templates["default"] if list(templates) == ["default"] else templates
    else:
        template = _config_template(files.get("tokenizer_config.json", {}).get("chat_template"),
                                    _side_file_path(folder, "tokenizer_config.json"))
    return template, _special_tokens(files)


def _config_template(template, where):
    """tokenizer_config.json's ``chat_template`` (read from ``where``) as ``read_chat_template`` gives it: None, a
    string, or a dict {name: template} of a non-empty list of ``{"name", "template"}`` (or such a dict itself, as
    transformers takes it); any other value is one ValueError naming the file."""
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, Mapping) and template and all(isinstance(v, str) for v in template.values()):
        return dict(template)
    if isinstance(template, list) and template and all(
            isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
            for t in template):
        return {t["name"]: t["template"] for t in template}
    raise ValueError(f"{where}: chat_template = {_shown(template)} must be a string (the Jinja template) or a "
                     f"non-empty list of named templates [{{\"name\": \"default\", \"template\": \"...\"}}, ...]; "
                     f"fix the file, or give a template with --chat-template FILE")


def _side_file_path(folder, name):
    """Where the side file ``name`` of ``folder`` was read (``model_files``): the folder's own, else the copy its
    tokenizer.json keeps."""
    path = Path(folder) / name
    return path if path.is_file() else f"the {name} kept in {Path(folder) / 'tokenizer.json'}"


def _shown(value, most=80):
    """``repr(value)``, cut to ``most`` characters."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def read_template_file(path, where):
    """The text of the Jinja chat template file ``path`` (``where`` names it in errors: "--chat-template",
    "[data] chat_template"); one ValueError for a file that is not UTF-8 text, naming it."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} {path} is not UTF-8 text ({e.reason} at byte {e.start}); save the template "
                         f"as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def read_special_tokens(folder, tokenizer=None):
    """The special tokens {"bos_token": ..., ...} of a model folder (``model_files``: tokenizer_config.json, and
    special_tokens_map.json over it in older folders, as transformers); ``read_chat_template`` gives them with the
    template, this without reading it (``--chat-template`` replaces it)."""
    return _special_tokens(model_files(folder, tokenizer))


def _special_tokens(files):
    """The special tokens of a model's side files ``files`` ({name: JSON object or text}, ``model_files``)."""
    config = files.get("tokenizer_config.json", {})
    tokens = {k: _token_text(config.get(k)) for k in NAMED_SPECIAL_TOKENS}
    if "added_tokens_decoder" not in config and "special_tokens_map.json" in files:
        legacy = files["special_tokens_map.json"]           # older folders: overrides, as transformers
        tokens.update({k: _token_text(legacy[k]) for k in NAMED_SPECIAL_TOKENS if k in legacy})
    return {k: v for k, v in tokens.items() if v is not None}


def read_json_object(path):
    """The JSON object in ``path`` ({} when there is no such file); one ValueError naming a bad file."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = bounded_json(path.read_bytes(), str(path))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is a JSON {type(data).__name__}, not an object; restore it")
    return data


# -- a model's chat format, and a conversation with it -------------------------------------------------------
@dataclasses.dataclass
class ChatFormat:
    """How conversations with one model are written: its template (a Jinja source, or a dict of named
    templates), the special tokens the template may use, extra template variables (``enable_thinking``),
    the text at which a reply ends (``stop_strings``; the default template's turn markers), and whether
    this is numformer's default format (``is_default``)."""
    template: str | dict
    special_tokens: dict = dataclasses.field(default_factory=dict)
    variables: dict = dataclasses.field(default_factory=dict)
    stop_strings: tuple = ()
    is_default: bool = False

    @classmethod
    def default(cls, special_tokens=None, variables=None):
        """numformer's plain-text format (``DEFAULT_TEMPLATE``), for a model without a template of its own."""
        return cls(DEFAULT_TEMPLATE, dict(special_tokens or {}), dict(variables or {}), DEFAULT_STOP_STRINGS, True)

    @classmethod
    def from_folder(cls, folder, variables=None, tokenizer=None):
        """The folder's template and special tokens (``read_chat_template``), else the default format."""
        template, tokens = read_chat_template(folder, tokenizer)
        if template is None:
            return cls.default(tokens, variables)
        return cls(template, tokens, dict(variables or {}))

    def render(self, messages, add_generation_prompt=False):
        """The text of ``messages`` in this format (``apply_chat_template`` with its tokens and variables)."""
        return apply_chat_template(messages, self.template, add_generation_prompt,
                                   special_tokens=self.special_tokens, **self.variables)

    def check(self, system=None):
        """Render the conversation of the system prompt ``system`` (or none) and an empty user message: the
        ValueError every message would meet, once (jinja2 missing, a template that is not valid Jinja or refuses
        the system prompt, or one that renders nothing, not even for the user message "Hello": ``EMPTY_PROMPT``)."""
        head = [] if system is None else [{"role": "system", "content": system}]
        if not self.render(head + [{"role": "user", "content": ""}], add_generation_prompt=True) and \
                not self.render(head + [{"role": "user", "content": "Hello"}], add_generation_prompt=True):
            raise ValueError(EMPTY_PROMPT)

    def encode(self, tokenizer, messages, add_generation_prompt=False):
        """The token ids of the rendered conversation: the tokenizer's encoding of the text, without adding
        special tokens of its own (the template writes them), as transformers tokenizes it."""
        return list(tokenizer.encode(self.render(messages, add_generation_prompt)))


def _decode(tokenizer, ids):
    """Text of ``ids`` without special tokens, for any numformer tokenizer."""
    try:
        return tokenizer.decode(ids, skip_special=True)
    except TypeError:                   # a tokenizer without special tokens (characters, symbols)
        return tokenizer.decode(ids)


class _Reply:
    """A reply as it is generated: ``add(token)`` decodes the text so far, streams what is certain (not the
    start of a stop string, not half a character) and says whether the reply has ended."""

    def __init__(self, tokenizer, stop_tokens, stop_strings, stream):
        self.tokenizer, self.stop_tokens, self.stop_strings = tokenizer, set(stop_tokens), stop_strings
        self.stream, self.ids, self.text, self.shown = stream, [], "", 0

    def add(self, token):
        if token in self.stop_tokens:
            return True
        self.ids.append(token)
        text = _decode(self.tokenizer, self.ids)
        if text.endswith("\ufffd"):                         # a character split across tokens: wait
            return False
        ends = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        self.text = text[:min(ends)] if ends else text
        held = 0 if ends else max((k for s in self.stop_strings for k in range(len(s), 0, -1)
                                   if text.endswith(s[:k])), default=0)
        self._show(len(self.text) - held)
        return bool(ends)

    def _show(self, upto):
        if self.stream is not None and upto > self.shown:
            self.stream(self.text[self.shown:upto])
        self.shown = max(self.shown, upto)

    def finish(self):
        self._show(len(self.text))
        return self.text


class ChatSession:
    """A conversation with a decoder-only model (``GPT``): an optional system prompt and the turns so far.

    ``send(text, stream)`` adds the user's message, renders the conversation with ``chat_format`` and the
    generation prompt, drops the oldest turns (a user message and its reply; the system prompt stays) until
    the prompt leaves room for the reply in the model's context (``max_new_tokens``, or half the context if
    that is less), generates with the key/value cache (``decoding.generate``: the sampling arguments as
    there, ``rng`` one Generator for the whole session) until a stop token (``stop_tokens``, e.g. the
    model's eos and end-of-turn ids) or a stop string, streams the reply's text to ``stream`` as it comes,
    and returns it. ``dropped`` counts the turns the last ``send`` dropped; ``reset()`` forgets the turns.
    A ``send`` interrupted while the reply is generated (``KeyboardInterrupt``, Ctrl-C) keeps the message and
    the reply so far (the text already streamed) in the history, then raises the interrupt again; one
    interrupted before generation starts keeps nothing. ``check()`` raises at once the error every message
    would meet (a template that cannot be rendered or renders nothing, a system prompt that cannot be encoded or
    does not fit).
    Defaults: no system prompt, max_new_tokens 256, no stop tokens, temperature 1, no top-k or top-p.
    """

    def __init__(self, model, tokenizer, chat_format, system=None, max_new_tokens=256, stop_tokens=(),
                 temperature=1.0, top_k=None, top_p=None, greedy=False, rng=None):
        self.model, self.tokenizer, self.format, self.system = model, tokenizer, chat_format, system
        self.max_new_tokens, self.stop_tokens = max_new_tokens, sorted({int(t) for t in stop_tokens})
        self.sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "greedy": greedy}
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.history, self.dropped = [], 0

    def reset(self):
        self.history, self.dropped = [], 0

    def messages(self):
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return system + self.history

    def check(self):
        """Raise the ValueError that every message would meet, once: the conversation of the system prompt and
        an empty message cannot be rendered (jinja2 missing, a template that refuses it or renders nothing:
        ``ChatFormat.check``), cannot be encoded (a character of the system prompt outside the vocabulary), or
        does not fit in the model's context."""
        self.format.check(self.system)
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        what = "the system prompt, written in the chat format," if system else "the chat format"
        try:
            ids = self.format.encode(self.tokenizer, system + [{"role": "user", "content": ""}], True)
        except ValueError as e:
            if "chat template" in str(e):
                raise
            raise ValueError(f"{what} cannot be encoded by the model's tokenizer: {e}") from None
        context = int(self.model.block_size)
        if len(ids) <= context:
            return
        if system:
            raise ValueError(f"the system prompt makes a prompt of {len(ids)} tokens (with the chat format) before "
                             f"any message, more than the model's context of {context}; shorten it")
        which = "numformer's chat format" if self.format.is_default else "the chat template"
        raise ValueError(f"the model's context of {context} tokens is too small for {which}: it needs {len(ids)} "
                         f"tokens before any message; use a model with a longer block_size, or give a shorter "
                         f"template with --chat-template FILE")

    def prompt_ids(self):
        """The ids of the conversation with the generation prompt, dropping the oldest turns to fit; none at all
        (a template that wrote nothing) is the ValueError ``EMPTY_PROMPT``."""
        context = int(self.model.block_size)
        limit = context - min(self.max_new_tokens, context // 2)
        while True:
            try:
                ids = self.format.encode(self.tokenizer, self.messages(), add_generation_prompt=True)
            except ValueError as e:
                if "chat template" in str(e):
                    raise
                raise ValueError(f"the conversation, written in the chat format, cannot be encoded: {e}") from None
            if not ids:
                raise ValueError(EMPTY_PROMPT)
            if len(ids) <= limit or len(self.history) <= 1:
                break
            self.history, self.dropped = self.history[2:], self.dropped + 1
        if len(ids) > context:
            with_system = " and the system prompt" if self.system is not None else ""
            raise ValueError(f"the message makes a prompt of {len(ids)} tokens (with the chat format{with_system}), "
                             f"more than the model's context of {context}; shorten it")
        return ids

    def send(self, text, stream=None):
        """The model's reply to ``text`` (streamed to ``stream(piece)`` as it is generated)."""
        self.dropped = 0
        self.history.append({"role": "user", "content": text})
        try:
            ids = self.prompt_ids()
        except (ValueError, KeyboardInterrupt):
            self.history.pop()
            raise
        reply = _Reply(self.tokenizer, self.stop_tokens, self.format.stop_strings, stream)
        try:
            generate(self.model, np.asarray(ids, dtype=np.int64), self.max_new_tokens, rng=self.rng,
                     stop_tokens=self.stop_tokens or None, stream=reply.add, **self.sampling)
        except KeyboardInterrupt:           # stopped by the user: what they saw of the reply stays
            self.history.append({"role": "assistant", "content": reply.text[:reply.shown]})
            raise
        answer = reply.finish()
        self.history.append({"role": "assistant", "content": answer})
        return answer


def _ids(value):
    """The token ids of an ``eos_token_id`` field: an id or a list of ids."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def generation_eos_ids(folder, tokenizer):
    """The ids at which transformers' ``generate`` stops the model in ``folder`` (``numformer generate``): the
    ``eos_token_id`` of its generation_config.json when it has one (``model_files``: an id or a list; a file
    without the key stops at none, as transformers' ``generate``), else ``model_eos_ids``; each as far as the
    vocabulary has it; sorted."""
    files = model_files(folder, tokenizer)
    if "generation_config.json" not in files:
        return model_eos_ids(folder, tokenizer)
    ids = _ids(files["generation_config.json"].get("eos_token_id"))
    return sorted({i for i in ids if 0 <= i < tokenizer.vocab_size})


def model_eos_ids(folder, tokenizer):
    """The ids that end the model's text in ``folder``, as a chat stops at any of them: ``eos_token_id`` of
    config.json and of generation_config.json (``model_files``; an id or a list: Llama 3's ``<|eot_id|>``,
    Gemma's ``<end_of_turn>``, ...) and the tokenizer's (``eos_ids``, ``special_ids["<eos>"]``), each as far as
    the vocabulary has it; sorted. (``generate`` stops where transformers' does: ``generation_eos_ids``.)"""
    ids = set(_ids(read_json_object(Path(folder) / "config.json").get("eos_token_id")))
    ids.update(_ids(model_files(folder, tokenizer).get("generation_config.json", {}).get("eos_token_id")))
    ids.update(_ids(getattr(tokenizer, "eos_ids", None)))
    ids.update(_ids(getattr(tokenizer, "special_ids", {}).get("<eos>")))
    return sorted(i for i in ids if 0 <= i < tokenizer.vocab_size)


def stop_token_ids(folder, tokenizer, chat_format):
    """The ids that end a reply of the model in ``folder``: ``model_eos_ids`` and the template's ``eos_token``
    (looked up in a ``PretrainedTokenizer``'s vocabulary); sorted."""
    ids = set(model_eos_ids(folder, tokenizer))
    token, hf = chat_format.special_tokens.get("eos_token"), getattr(tokenizer, "hf", None)
    if token is not None and hf is not None and hf.token_to_id(token) is not None:
        ids.add(hf.token_to_id(token))
    return sorted(i for i in ids if 0 <= i < tokenizer.vocab_size)


# -- supervised fine-tuning: a conversation as token ids and labels --------------------------------------------
def encode_chat(source, messages, train_on="assistant"):
    """(ids, labels) of a conversation for supervised fine-tuning: ``ids`` the token ids of the rendered
    conversation (as ``ChatFormat.encode``, transformers' ``apply_chat_template(tokenize=True)``), ``labels``
    the same ids where the loss is taken and -100 (``IGNORE``) elsewhere: on the assistant's turns only by
    default (``train_on="assistant"``), everywhere with ``train_on="all"``. Both are lists of the same length,
    aligned as transformers' ``labels`` are (the model shifts them: position t predicts labels[t + 1]).

    source: ``(tokenizer, ChatFormat)``, or an object with ``.tokenizer`` and ``.chat_format``.

    The assistant spans are found without ``{% generation %}`` tags (which Llama 3, Qwen and SmolLM templates
    lack): for the k-th message, if it is the assistant's, the conversation is rendered up to it with the
    generation prompt (where the reply starts) and with it (where the turn ends, end-of-turn marker included);
    those two lengths are its characters in the whole rendering, and a token is labelled when its characters
    overlap them.
    """
    tokenizer, fmt = source if isinstance(source, tuple) else (source.tokenizer, source.chat_format)
    if train_on not in ("assistant", "all"):
        raise ValueError(f"train_on = {train_on!r} should be 'assistant' or 'all'")
    text = fmt.render(messages)
    ids = list(tokenizer.encode(text))
    if train_on == "all":
        return ids, list(ids)
    spans = assistant_spans(fmt, messages, text)
    ends = _token_ends(tokenizer, ids, text)
    labels, start = [], 0
    for token, end in zip(ids, ends):
        inside = any(start < b and end > a for a, b in spans)
        labels.append(token if inside else -100)
        start = end
    return ids, labels


def assistant_spans(fmt, messages, text=None):
    """[(first character, end character)] of each assistant turn in the rendering of ``messages``."""
    text = fmt.render(messages) if text is None else text
    spans = []
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before, upto = fmt.render(messages[:k], add_generation_prompt=True), fmt.render(messages[:k + 1])
        if not (text.startswith(before) and text.startswith(upto) and len(before) <= len(upto)):
            raise ValueError(f"the chat template renders message {k} differently once later messages follow (it "
                             f"rewrites earlier turns), so its assistant span cannot be found by rendering up to "
                             f"it; train on such conversations with train_on = 'all' or another template")
        spans.append((len(before), len(upto)))
    return spans


def _token_ends(tokenizer, ids, text):
    """The character offset in ``text`` where each token of ``ids`` ends (ids: the encoding of text)."""
    pieces = [tokenizer.decode([i]) for i in ids]
    if "".join(pieces) == text:                                   # each token decodes to whole characters
        return np.cumsum([len(p) for p in pieces]).tolist()
    ends, last = [], 0                                            # tokens splitting a character: prefix decodes
    for n in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:n])
        last = last if decoded.endswith("\ufffd") else len(decoded)
        ends.append(last)
    if tokenizer.decode(ids) != text:
        raise ValueError("the tokenizer does not decode its encoding of the conversation back to the same text, "
                         "so its assistant tokens cannot be located; use train_on = 'all'")
    return ends


def alpaca_messages(record):
    """An Alpaca-style record ``{"instruction", "input", "output"}`` as a conversation: the instruction (and
    its input after a blank line) from the user, the output from the assistant."""
    prompt = record["instruction"].strip()
    if str(record.get("input") or "").strip():
        prompt += "\n\n" + record["input"].strip()
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]
