"""The explorer's local server: the page, and a JSON API the page calls. Standard library only (http.server),
bound to 127.0.0.1, so nothing outside this computer can reach it.

    explorer = Explorer(model, tokenizer, seed=0)
    server = make_server(explorer, port=8000, data=page_data(...))     # port 0: any free port
    server.serve_forever()                                           # server.url says where
    with serving(server):                                            # or in a thread, for a with block
        ...                                                          # (a notebook, a test)

API (POST, a JSON object in and out; a bad request gets status 400 and {"error": "..."}):

    /api/analyze  {"text": TEXT} or {"ids": [...]}                 -> the analysis (``data.analyse``)
    /api/logits   {"ids": [...], "position": t}                    -> {"logits": [V]} of position t
    /api/step     {"ids": [...], "temperature", "top_k", "top_p", "greedy"}
                  -> {"token": id, "analysis": ...}: one token drawn by ``numformer.sampling.sample_next`` from the
                     last position's logits, appended, and the longer sequence analysed

GET / is the page. One request uses the model at a time (a lock): its modules keep caches between calls.
Other web pages open in the same browser cannot use the API: a request whose Host header is not this server's
address (DNS rebinding) is refused with 403, and a POST must say ``Content-Type: application/json``, which a
page of another origin can send only after a CORS preflight that this server never grants (415 otherwise).
"""
from __future__ import annotations

import contextlib
import errno
import json
import sys
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from .._limits import bounded_json
from ..sampling import sample_next
from .data import analyse, check_ids, position_logits, run
from .page import render_page

HOST = "127.0.0.1"
MAX_BODY = 1 << 20          # bytes a request may send


class Explorer:
    """A model and its tokenizer behind the API; ``rng`` (from ``seed``) draws the stepped tokens."""

    def __init__(self, model, tokenizer, seed=None):
        self.model, self.tokenizer = model, tokenizer
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()

    def _ids(self, body, key="ids"):
        ids = body.get(key)
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"{key!r} must be a list of token ids (integers)")
        return check_ids(self.model, ids)

    def analyze(self, body):
        """/api/analyze: ``data.analyse`` of body["text"] (encoded with the tokenizer) or of body["ids"]."""
        if "text" in body:
            if not isinstance(body["text"], str):
                raise ValueError("'text' must be a string")
            ids = check_ids(self.model, self.tokenizer.encode_prompt(body["text"]), "the prompt")
        else:
            ids = self._ids(body)
        return analyse(self.model, self.tokenizer, ids)

    def logits(self, body):
        """/api/logits: {"logits": [V]} of position body["position"] of body["ids"] (``data.position_logits``)."""
        position = body.get("position")
        if not isinstance(position, int) or isinstance(position, bool):
            raise ValueError("'position' must be an integer")
        return {"logits": position_logits(self.model, self._ids(body), position)}

    def step(self, body):
        """/api/step: {"token": id, "analysis": ...}: the next token of body["ids"] drawn by ``sample_next``
        (temperature 1.0, top_k and top_p None, greedy false unless the body says otherwise) with ``rng``,
        and the analysis of the ids with it appended; a ValueError when the ids fill block_size."""
        ids = self._ids(body)
        if len(ids) >= self.model.block_size:
            raise ValueError(f"the context is full: the model reads at most {self.model.block_size} tokens")
        logits = run(self.model, ids)[0][-1]
        token = int(sample_next(logits, self.rng, temperature=body.get("temperature", 1.0),
                                top_k=body.get("top_k"), top_p=body.get("top_p"),
                                greedy=bool(body.get("greedy", False))))
        return {"token": token, "analysis": analyse(self.model, self.tokenizer, np.append(ids, token))}


ROUTES = {"/api/analyze": Explorer.analyze, "/api/logits": Explorer.logits, "/api/step": Explorer.step}


class Handler(BaseHTTPRequestHandler):
    """GET / -> the page; POST /api/... -> ``ROUTES``. ``self.server`` carries ``explorer`` and ``page``."""

    server_version = "numformer-explore"

    def log_message(self, format, *args):        # quiet: the terminal shows the URL and errors only
        pass

    def _send(self, status, body, content_type):
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status, obj):
        self._send(status, json.dumps(obj, ensure_ascii=False, allow_nan=False), "application/json; charset=utf-8")

    def _foreign(self):
        """Whether the request names another host than this server (a page of another site, DNS rebinding):
        answered with 403."""
        port = self.server.server_address[1]
        if self.headers.get("Host", "") in (f"{HOST}:{port}", f"localhost:{port}"):
            return False
        self._json(HTTPStatus.FORBIDDEN, {"error": f"the explorer answers at {self.server.url} only"})
        return True

    def do_GET(self):
        if self._foreign():
            return
        if self.path.split("?")[0] in ("/", "/index.html"):
            self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {self.path}; the explorer is at /"})

    def do_POST(self):
        if self._foreign():
            return
        route = ROUTES.get(self.path)
        if route is None:
            return self._json(HTTPStatus.NOT_FOUND, {"error": f"no API {self.path}; there are {sorted(ROUTES)}"})
        if self.headers.get_content_type() != "application/json":
            return self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send Content-Type: application/json"})
        try:
            body = self._body()
            with self.server.explorer.lock:
                reply = route(self.server.explorer, body)
        except ValueError as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except Exception as e:      # noqa: BLE001 -- a bug: the page says so, the terminal shows the traceback
            traceback.print_exc(file=sys.stderr)
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error ({type(e).__name__}): "
                                                                          f"see the terminal"})
        self._json(HTTPStatus.OK, reply)

    def _body(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise ValueError("a bad Content-Length") from None
        if not 0 < length <= MAX_BODY:
            raise ValueError(f"send a JSON object of at most {MAX_BODY} bytes")
        try:
            body = bounded_json(self.rfile.read(length), "the request", max_bytes=MAX_BODY)
        except ValueError:
            raise ValueError("the request is not JSON") from None
        if not isinstance(body, dict):
            raise ValueError("send a JSON object")
        return body


def make_server(explorer, port, data):
    """A ``ThreadingHTTPServer`` on 127.0.0.1:``port`` (0: a free port) serving ``data``'s page; ``server.url``."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0: any free port), got {port}")
    try:
        server = ThreadingHTTPServer((HOST, port), Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} is in use; choose another with --port, or --port 0 for any free "
                             f"port") from None
        raise
    server.daemon_threads = True
    server.explorer = explorer
    server.page = render_page({**data, "mode": "server"})
    server.url = f"http://{HOST}:{server.server_address[1]}/"
    return server


@contextlib.contextmanager
def serving(server):
    """Serve ``server`` in a background thread for the ``with`` block; shut down and closed at its end."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


__all__ = ["Explorer", "make_server", "serving", "HOST", "ROUTES"]
