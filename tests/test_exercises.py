"""numformer exercises: every stub fails as shipped, every solution passes, and typical mistakes fail at the step
that catches them, with a message that says what and where; ``exercises train`` reproduces the library's curve.

The solutions in tests/exercise_solutions/ are written as a learner writes them (not copied from numformer.ops);
each mistake below is one of them with one change, as learners make it.
"""
from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer import exercises as E
from numformer import ops
from numformer.exercises import training
from numformer.nn import dispatch

SOLUTIONS = Path(__file__).resolve().parent / "exercise_solutions"

SIGNATURE, SHAPES, FORWARD, BACKWARD, FD, EDGE, KEYWORDS = (s.title for s in E.checker.STANDARD_STEPS)

# (exercise, the mistake, [(text of the solution, what the learner wrote instead)], failing step, in the message)
MISTAKES = [
    ("softmax", "the backward reuses y's memory",
     [("    return y * dy - y * np.sum(y * dy, axis=axis, keepdims=True)",
       "    s = np.sum(y * dy, axis=axis, keepdims=True)\n    y *= dy - s\n    return y")],
     SHAPES, "softmax_backward changed the output y of softmax_forward through the cache"),
    ("softmax", "masked entries of dy zeroed in place",
     [("    y, axis = cache\n", "    y, axis = cache\n    dy[y == 0] = 0\n")],
     EDGE, "softmax_backward changed its argument dy in place"),
    ("softmax", "no max subtracted", [("e = np.exp(x - m)", "e = np.exp(x)")], EDGE,
     "edge case 'large entries'"),
    ("softmax", "backward recomputes the softmax from x without the max",
     [("return y, (y, axis)", "return y, (x, axis)"),
      ("    y, axis = cache\n", "    x, axis = cache\n    y = np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True)\n")],
     EDGE, "not finite"),
    ("softmax", "backward sums over the last axis whatever axis is",
     [("np.sum(y * dy, axis=axis, keepdims=True)", "np.sum(y * dy, axis=-1, keepdims=True)")], KEYWORDS,
     "keyword case 'axis=0'"),
    ("softmax", "no guard for a fully masked slice", [("    m = np.where(np.isfinite(m), m, 0.0)\n", "")], EDGE,
     "edge case 'masked entries'"),
    ("softmax", "one maximum over the whole array",
     [("m = np.max(x, axis=axis, keepdims=True)", "m = np.max(x)")], EDGE, "edge case 'slices far apart'"),
    ("softmax", "the backward reads the last forward's y from a global",
     [("    return y, (y, axis)", "    global LAST\n    LAST = (y, axis)\n    return y, None"),
      ("    y, axis = cache", "    y, axis = LAST")], BACKWARD, "a second softmax_forward call on other inputs"),
    ("softmax", "the backward reads the axis from a global",
     [("    return y, (y, axis)", "    global AXIS\n    AXIS = axis\n    return y, y"),
      ("    y, axis = cache", "    y = cache\n    axis = AXIS")],
     BACKWARD, "a second softmax_forward call on the inputs of case 'axis=0' (x (3, 4, 5), axis=0)"),
    ("log_softmax", "one maximum over the whole array",
     [("m = np.max(x, axis=axis, keepdims=True)", "m = np.max(x)")], EDGE, "edge case 'slices far apart'"),
    ("cross_entropy", "one maximum over the whole array", [("m = z.max(axis=1, keepdims=True)", "m = z.max()")],
     EDGE, "edge case 'positions far apart'"),
    ("relu_squared", "the backward writes into the forward's x through its cache",
     [("    return y, dydx", "    return y, (x, r)"),
      ("    return dy * cache", "    x, r = cache\n    x[x < 0] = 0\n    return dy * 2 * r")],
     SHAPES, "relu_squared_backward (through the cache of relu_squared_forward) changed its argument x"),
    ("log_softmax", "the log of a softmax", [("y = x - lse", "y = np.log(np.exp(x - m) / total)")], EDGE,
     "edge case 'widely spread entries'"),
    ("log_softmax", "backward without exp", [("dy - np.exp(y) *", "dy - y *")], BACKWARD, "dx differs"),
    ("linear", "dW transposed", [("dW = rows_dy.T @ rows_x", "dW = rows_x.T @ rows_dy")], SHAPES,
     "dW of shape (4, 3)"),
    ("linear", "dW for 2-D inputs only", [("dW = rows_dy.T @ rows_x", "dW = dy.T @ x")], EDGE,
     "edge case 'batch axes'"),
    ("linear", "db not summed over positions", [("db = rows_dy.sum(axis=0) if has_bias", "db = dy if has_bias")],
     SHAPES, "db of shape (5, 3)"),
    ("linear", "db of zeros without a bias", [("if has_bias else None", "if has_bias else np.zeros(d_out)")],
     KEYWORDS, "db should be None"),
    ("linear", "whether there is a bias kept in a global",
     [("    return y, (x, W, b is not None)",
       "    global HAS_BIAS\n    HAS_BIAS = b is not None\n    return y, (x, W)"),
      ("    x, W, has_bias = cache", "    x, W = cache\n    has_bias = HAS_BIAS")],
     BACKWARD, "a second linear_forward call on the inputs of case 'b=None' (x (2, 3, 4), W (3, 4))"),
    ("linear", "weight_grad ignored", [(" if weight_grad else None", "")], KEYWORDS,
     "keyword case 'weight_grad=False'"),
    ("embedding", "+= at repeated indices", [("np.add.at(dE, ids.ravel(), dy.reshape(-1, shape[1]))",
                                              "dE[ids.ravel()] += dy.reshape(-1, shape[1])")],
     EDGE, "edge case 'repeated ids'"),
    ("embedding", "assignment instead of a sum", [("np.add.at(dE, ids.ravel(), dy.reshape(-1, shape[1]))",
                                                   "dE[ids] = dy")], EDGE, "dE differs"),
    ("embedding", "ids not flattened", [("ids.ravel()", "ids")], SHAPES, "raised"),
    ("gelu", "GELU' = Φ", [("dydx = cdf + x * pdf", "dydx = cdf")], BACKWARD, "dx differs"),
    ("gelu", "tanh derivative without du/dx", [(" * c * (1 + 3 * 0.044715 * x ** 2)", "")], KEYWORDS,
     "keyword case 'approximate=\"tanh\"'"),
    ("gelu", "tanh from exponentials", [("t = np.tanh(c * (x + 0.044715 * x ** 3))",
                                         "u = c * (x + 0.044715 * x ** 3)\n"
                                         "        t = (np.exp(u) - np.exp(-u)) / (np.exp(u) + np.exp(-u))")],
     KEYWORDS, "large inputs"),
    ("gelu", "approximate ignored", [('if approximate == "tanh":', "if False:"),
                                     ('elif approximate == "none":', 'elif approximate in ("none", "tanh"):')],
     KEYWORDS, "y differs"),
    ("gelu", "an unknown approximate taken for the exact GELU",
     [('    elif approximate == "none":\n', "    else:\n"),
      ("    else:\n        raise ValueError(f\"approximate is 'none' or 'tanh', not {approximate!r}\")\n", "")],
     KEYWORDS, "keyword case 'approximate=\"erf\"': gelu_forward(x (4, 7), approximate='erf') returned a result; "
     "the reference refuses it with ValueError"),
    ("gelu", "an unknown approximate refused with another error",
     [("        raise ValueError(", "        raise KeyError(")], KEYWORDS,
     "gelu_forward raised KeyError: \"approximate is 'none' or 'tanh', not 'erf'\" at line"),
    ("relu_squared", "derivative 2x, without the max", [("dydx = 2 * r", "dydx = 2 * x")], BACKWARD, "dx differs"),
    ("relu_squared", "derivative max(0, x), without the 2", [("dydx = 2 * r", "dydx = r")], BACKWARD,
     "dx differs"),
    ("relu_squared", "derivative 2y / x", [("dydx = 2 * r", "dydx = 2 * y / x")], EDGE,
     "edge case 'inputs exactly at the kink'"),
    ("relu_squared", "only y cached, the derivative taken as 2√y",
     [("return y, dydx", "return y, y"), ("return dy * cache", "return dy * 2 * np.sqrt(cache)")], EDGE,
     "edge case 'large inputs'"),
    ("relu_squared", "squared, then masked", [("y = r ** 2", "y = (x > 0) * x ** 2")], EDGE,
     "edge case 'large inputs'"),
    ("layer_norm", "eps keyword-only", [("def layer_norm_forward(x, gamma, beta, eps=1e-5)",
                                         "def layer_norm_forward(x, gamma, beta, *, eps=1e-5)")],
     "import and signature", "which may be given by position"),
    ("layer_norm", "x renamed in the forward (the grader passes it by name)",
     [("def layer_norm_forward(x, gamma, beta, eps=1e-5):\n", "def layer_norm_forward(z, gamma, beta, eps=1e-5):\n"
                                                              "    x = z\n")],
     SIGNATURE, "parameter 1 is z, not x (a caller passes it by name)"),
    ("linear", "weight_grad renamed (passed by name)",
     [("def linear_backward(dy, cache, weight_grad=True):", "def linear_backward(dy, cache, need_dw=True):"),
      (" if weight_grad else", " if need_dw else")], SIGNATURE, "parameter 3 is need_dw, not weight_grad"),
    ("linear", "the cache keyword-only (the model passes it by position)",
     [("def linear_backward(dy, cache, weight_grad=True):", "def linear_backward(dy, *, cache, weight_grad=True):")],
     SIGNATURE, "cache is keyword-only, where the exercise's cache is positional or keyword"),
    ("adamw", "betas defaulting to other values",
     [("betas=(0.9, 0.999)", "betas=[0.9, 0.99]")], SIGNATURE, "betas defaults to [0.9, 0.99], not (0.9, 0.999)"),
    ("layer_norm", "eps outside the square root", [("r = 1 / np.sqrt(var + eps)", "r = 1 / (np.sqrt(var) + eps)")],
     FORWARD, "y differs"),
    ("layer_norm", "unbiased variance", [("x.var(axis=-1, keepdims=True)", "x.var(axis=-1, keepdims=True, ddof=1)")],
     FORWARD, "y differs"),
    ("layer_norm", "backward without the x̂ term",
     [(" - xhat * (g * xhat).mean(axis=-1, keepdims=True)", "")], BACKWARD, "dgamma, dbeta match"),
    ("layer_norm", "dgamma summed over the first axis only",
     [("dgamma = (dy * xhat).reshape(-1, d).sum(axis=0)", "dgamma = (dy * xhat).sum(axis=0)")], SHAPES,
     "dgamma of shape (3, 8)"),
    ("layer_norm", "x centred in place", [("xhat = (x - mean) * r", "x -= mean\n    xhat = x * r")], SHAPES,
     "changed its argument x in place"),
    ("layer_norm", "γ forgotten in the backward", [("g = dy * gamma", "g = dy")], BACKWARD, "dx differs"),
    ("rms_norm", "the mean subtracted", [("xhat = x * r", "xhat = (x - x.mean(axis=-1, keepdims=True)) * r")],
     FORWARD, "y differs"),
    ("rms_norm", "eps outside the square root",
     [("np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)", "(np.sqrt((x ** 2).mean(axis=-1, keepdims=True)) + eps)")],
     FORWARD, "y differs"),
    ("rms_norm", "backward without the r term", [(" - xhat * (g * xhat).mean(axis=-1, keepdims=True)", "")],
     BACKWARD, "dx differs"),
    ("dropout", "kept entries not rescaled", [(") / (1 - p)", ")")], "forward: zeroed with probability p, the "
     "rest scaled", "either 0 or x / (1 - p)"),
    ("dropout", "keeps with probability p", [(">= p", "< p")], "forward: zeroed with probability p, the rest scaled",
     "% of the entries are zeroed; each one is zeroed with probability p = 0.3"),
    ("dropout", "np.random instead of rng", [("rng.random(x.shape)", "np.random.random(x.shape)"),
                                             ("def dropout_forward", "import numpy as np\n\n\ndef dropout_forward")],
     "forward: zeroed with probability p, the rest scaled", "draw the mask from the rng argument"),
    ("dropout", "backward ignores the mask", [("return dy * cache", "return dy")], "backward: the forward's mask",
     "at a dropped entry"),
    ("dropout", "one mask for every row", [("rng.random(x.shape)", "rng.random(x.shape[-1:])")],
     "forward: zeroed with probability p, the rest scaled", "each column is dropped or kept whole"),
    ("dropout", "the mask kept in a global", [("return x * mask, mask", "global MASK\n    MASK = mask\n    return x * mask, None"),
                                              ("return dy * cache", "return dy * MASK")],
     "backward: the forward's mask", "of the first call's mask"),
    ("dropout", "half a draw used twice", [("rng.random(x.shape)", "np.resize(rng.random(x.size // 2), x.shape)"),
                                           ("def dropout_forward", "import numpy as np\n\n\ndef dropout_forward")],
     "forward: zeroed with probability p, the rest scaled", "rows 0 and 50 have the same mask"),
    ("dropout", "a short draw repeated", [("rng.random(x.shape)", "np.resize(rng.random(1001), x.shape)"),
                                          ("def dropout_forward", "import numpy as np\n\n\ndef dropout_forward")],
     "forward: zeroed with probability p, the rest scaled", "repeats itself every 1001 entries"),
    ("dropout", "a fixed number of entries", [("rng.random(x.shape) >= p",
                                               "rng.permutation(x.size).reshape(x.shape) >= round(p * x.size)")],
     "forward: zeroed with probability p, the rest scaled", "all zero exactly 9000 entries"),
    ("dropout", "a fixed number in each row", [("rng.random(x.shape) >= p",
                                                "rng.random(x.shape).argsort(axis=-1) >= round(p * x.shape[-1])")],
     "forward: zeroed with probability p, the rest scaled", "every row has exactly 90 dropped entries"),
    ("cross_entropy", "no max subtracted", [("logp = z - m - np.log(np.exp(z - m)", "logp = z - np.log(np.exp(z)")],
     EDGE, "edge case 'large logits'"),
    ("cross_entropy", "ignored positions counted", [("max(n, 1)", "len(t)")], EDGE, "edge case 'ignored targets'"),
    ("cross_entropy", "0 / 0 when every target is ignored", [("max(n, 1)", "n")], EDGE,
     "edge case 'every target ignored'"),
    ("cross_entropy", "smoothing target set, not added", [("q[np.arange(len(t)), t] += 1 - eps",
                                                           "q[np.arange(len(t)), t] = 1 - eps")],
     KEYWORDS, "(the forward matches)"),
    ("cross_entropy", "the ignored targets set to 0 in the caller's array",
     [("    t = np.where(keep, t, 0)\n", "    safe = np.where(keep, t, 0)\n"),
      ("nll = -logp[np.arange(len(t)), t]", "nll = -logp[np.arange(len(t)), safe]"),
      ("    q[np.arange(len(t)), t] += 1 - eps", "    t[~keep] = 0\n    q[np.arange(len(t)), t] += 1 - eps")],
     EDGE, "cross_entropy_backward (through the cache of cross_entropy_forward) changed its argument targets"),
    ("cross_entropy", "ignore_index fixed at -100", [("keep = t != ignore_index", "keep = t != -100")], KEYWORDS,
     "keyword case 'ignore_index=0'"),
    ("scaled_dot_product_attention", "the mask forgotten in the backward",
     [("    q, k, v, p, keep, scale, capped = cache\n",
       "    q, k, v, p, keep, scale, capped = cache\n    s = (q @ np.swapaxes(k, -1, -2)) * scale\n"
       "    p = np.exp(s - s.max(axis=-1, keepdims=True))\n    p = p / p.sum(axis=-1, keepdims=True)\n")],
     EDGE, "edge case 'a padding mask'"),
    ("scaled_dot_product_attention", "k.T on batched keys", [("kt = np.swapaxes(k, -1, -2)", "kt = k.T")], SHAPES,
     "raised ValueError"),
    ("scaled_dot_product_attention", "no guard for a fully masked row", [("    m[~np.isfinite(m)] = 0\n", "")], EDGE,
     "edge case 'a fully masked row'"),
    ("scaled_dot_product_attention", "the scale forgotten in the backward",
     [("(dp * p).sum(axis=-1, keepdims=True)) * scale", "(dp * p).sum(axis=-1, keepdims=True))")], BACKWARD,
     "dv matches"),
    ("scaled_dot_product_attention", "causal mask aligned bottom-right",
     [("np.tril(np.ones((t_q, t_k), dtype=bool))", "np.tril(np.ones((t_q, t_k), dtype=bool), k=t_k - t_q)")],
     KEYWORDS, "keyword case 'is_causal=True with more keys'"),
    ("scaled_dot_product_attention", "dropout forgotten in the backward", [("dp = dp * keep", "dp = dp")], KEYWORDS,
     "keyword case 'dropout_p=0.5'"),
    ("scaled_dot_product_attention", "keep and drop swapped", [(">= dropout_p) / (1", "< dropout_p) / (1")],
     KEYWORDS, "keyword case 'dropout_p=0.1'"),
    ("scaled_dot_product_attention", "kept weights divided by p", [(") / (1 - dropout_p)", ") / dropout_p")],
     KEYWORDS, "keyword case 'dropout_p=0.1'"),
    ("scaled_dot_product_attention", "the keep-mask from a generator of its own",
     [("rng.random(p.shape)", "np.random.default_rng(0).random(p.shape)"),
      ("def scaled_dot_product_attention_forward", "import numpy as np\n\n\ndef scaled_dot_product_attention_forward")],
     KEYWORDS, "generators of different seeds drop the same weights"),
    ("scaled_dot_product_attention", "one keep-mask for every batch element and head",
     [("rng.random(p.shape)", "rng.random(p.shape[-2:])")], KEYWORDS, "every batch element has the same mask"),
    ("scaled_dot_product_attention", "a fixed number of weights in each row",
     [("rng.random(p.shape) >= dropout_p", "rng.random(p.shape).argsort(axis=-1) >= round(dropout_p * p.shape[-1])")],
     KEYWORDS, "every row has exactly 1 dropped entries"),
    ("scaled_dot_product_attention", "a fixed number of weights",
     [("rng.random(p.shape) >= dropout_p", "rng.permutation(p.size).reshape(p.shape) >= round(dropout_p * p.size)")],
     KEYWORDS, "each drop exactly round(dropout_p"),
    ("scaled_dot_product_attention", "whole key columns dropped",
     [("rng.random(p.shape)", "rng.random(p.shape[:-2] + (1, p.shape[-1]))")], KEYWORDS,
     "each column is dropped or kept whole"),
    ("scaled_dot_product_attention", "the mask ignored when causal",
     [("    if attn_mask is not None:\n", "    if attn_mask is not None and not is_causal:\n")], KEYWORDS,
     "keyword case 'is_causal=True with a padding mask'"),
    ("scaled_dot_product_attention", "the float mask ignored when causal",
     [("        else:\n            s = s + attn_mask\n",
       "        elif not is_causal:\n            s = s + attn_mask\n")],
     KEYWORDS, "keyword case 'is_causal=True with a float mask'"),
    ("scaled_dot_product_attention", "the causal mask skipped under a float mask",
     [("    if is_causal:\n", "    if is_causal and (attn_mask is None or attn_mask.dtype == bool):\n")],
     KEYWORDS, "keyword case 'is_causal=True with a float mask'"),
    ("scaled_dot_product_attention", "scale 0 taken for the default",
     [("    if scale is None:\n        scale = 1 / math.sqrt(q.shape[-1])\n",
       "    scale = scale or 1 / math.sqrt(q.shape[-1])\n")], KEYWORDS, "keyword case 'scale=0.0'"),
    ("scaled_dot_product_attention", "soft-cap's derivative forgotten", [("ds = ds * (1 - capped ** 2)", "ds = ds")],
     KEYWORDS, "keyword case 'softcap=1.5'"),
    ("scaled_dot_product_attention", "soft-cap after the mask",
     [("    capped = None\n    if softcap is not None:\n        capped = np.tanh(s / softcap)\n"
       "        s = softcap * capped\n", "    capped = None\n"),
      ("    m = s.max(", "    if softcap is not None:\n        capped = np.tanh(s / softcap)\n"
                         "        s = softcap * capped\n    m = s.max(")],
     KEYWORDS, "keyword case 'softcap=1.5'"),
    ("split_heads", "reshape without the transpose", [("return np.moveaxis(y, -2, -3), x.shape",
                                                       "return y.reshape(*lead, n_heads, T, E // n_heads), x.shape")],
     FORWARD, "y differs"),
    ("split_heads", "backward reshapes without moving the axes back",
     [("np.moveaxis(dy, -3, -2).reshape(cache)", "dy.reshape(cache)")], BACKWARD, "dx differs"),
    ("split_heads", "(B, T, E) only", [("*lead, T, E = x.shape", "B, T, E = x.shape"), ("*lead, T, n_heads", "B, T, n_heads")],
     EDGE, "edge case 'batch axes'"),
    ("merge_heads", "reshape without the transpose", [("np.moveaxis(x, -3, -2).reshape(*lead, T, h * d)",
                                                       "x.reshape(*lead, T, h * d)")], FORWARD, "y differs"),
    ("merge_heads", "backward reshapes without moving the axes back",
     [("np.moveaxis(dy.reshape(*lead, T, h, d), -2, -3)", "dy.reshape(*lead, h, T, d)")], BACKWARD, "dx differs"),
    ("repeat_kv", "tiled heads", [("np.repeat(x, n_rep, axis=1)", "np.tile(x, (1, n_rep, 1, 1))")], FORWARD,
     "y differs"),
    ("repeat_kv", "gradient of one copy only", [(".sum(axis=2)", "[:, :, 0]")], BACKWARD, "dx differs"),
    ("repeat_kv", "copies averaged", [(".sum(axis=2)", ".mean(axis=2)")], BACKWARD, "dx differs"),
    ("rope", "backward rotates by +θ", [("_rotate(dy * sin, -1)", "_rotate(dy * sin, 1)")], BACKWARD, "dx differs"),
    ("rope", "exponent 2i/d with i counting by twos",
     [("theta ** (-np.arange(0, d, 2) / d)", "theta ** (-2 * np.arange(0, d, 2) / d)")], FORWARD, "y differs"),
    ("rope", "offset ignored", [("np.arange(offset, offset + T)", "np.arange(T)")], KEYWORDS,
     "keyword case 'offset=3'"),
    ("rope", "offset added to explicit positions",
     [("    if positions is None:\n        positions = np.arange(offset, offset + T)",
       "    if positions is None:\n        positions = np.arange(T)\n    positions = np.asarray(positions) + offset")],
     KEYWORDS, "keyword case 'positions (T,) and offset=3'"),
    ("rope", "positions (B, T) not broadcast over the heads", [("if cos.ndim == 3 and x.ndim == 4:", "if False:")],
     KEYWORDS, "keyword case 'positions (B, T)'"),
    ("rope", "scaling ignored", [("    if scaling is not None:\n        freqs, a = rope_inverse_frequencies(", "    if False:\n        freqs, a = rope_inverse_frequencies(")],
     KEYWORDS, "keyword case 'scaling linear'"),
    ("rope", "the attention factor forgotten",
     [("cos, sin = a * np.cos(angles), a * np.sin(angles)", "cos, sin = np.cos(angles), np.sin(angles)")],
     KEYWORDS, "keyword case 'scaling yarn'"),
    ("rope", "dynamic scaling's n taken as T", [("int(np.max(positions)) + 1)", "x.shape[-2])")], KEYWORDS,
     "keyword case 'scaling dynamic'"),
    ("swiglu", "b_up's gradient returned when b_gate is given", [("if has_bu else None", "if has_bg else None")],
     KEYWORDS, "keyword case 'b_up alone'"),
    ("swiglu", "SiLU' = σ", [("(s + a * s * (1 - s))", "s")], BACKWARD, "(dw_up, dw_down"),
    ("swiglu", "gate on the up projection", [("s = 1 / (1 + np.exp(-a))", "s = 1 / (1 + np.exp(-b))"),
                                             ("h = a * s * b", "h = b * s * a")], FORWARD, "y differs"),
    ("swiglu", "σ as exp(a) / (1 + exp(a))", [("s = 1 / (1 + np.exp(-a))", "s = np.exp(a) / (1 + np.exp(a))")],
     EDGE, "edge case 'large pre-activations'"),
    ("swiglu", "dx through the gate only", [("dx = da @ w_gate + db @ w_up", "dx = da @ w_gate")], BACKWARD,
     "dx differs"),
    ("adamw", "no bias corrections", [("m_hat = exp_avg / (1 - beta1 ** step)", "m_hat = exp_avg"),
                                      ("v_hat = exp_avg_sq / (1 - beta2 ** step)", "v_hat = exp_avg_sq")],
     "one step against the reference", "param differs"),
    ("adamw", "L2 weight decay (Adam's)", [("param *= 1 - lr * weight_decay", "grad = grad + weight_decay * param")],
     "one step against the reference", "param differs"),
    ("adamw", "arrays rebound, not updated in place",
     [("param *= 1 - lr * weight_decay", "param = param * (1 - lr * weight_decay)"),
      ("exp_avg *= beta1\n    exp_avg += (1 - beta1) * grad", "exp_avg = beta1 * exp_avg + (1 - beta1) * grad"),
      ("exp_avg_sq *= beta2\n    exp_avg_sq += (1 - beta2) * grad ** 2",
       "exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad ** 2"),
      ("param -= lr", "param = param - lr")], "in place, shapes and dtype", "left param unchanged"),
    ("adamw", "eps inside the square root", [("np.sqrt(v_hat) + eps", "np.sqrt(v_hat + eps)")],
     "one step against the reference", "param differs"),
    ("adamw", "weight decay after the update", [("    param *= 1 - lr * weight_decay\n", ""),
                                                ("param -= lr * m_hat / (np.sqrt(v_hat) + eps)",
                                                 "param -= lr * m_hat / (np.sqrt(v_hat) + eps)\n"
                                                 "    param *= 1 - lr * weight_decay")],
     "one step against the reference", "param differs"),
    ("lora", "the scaling forgotten in the backward", [("du = s * (rows_dy @ B)", "du = rows_dy @ B"),
                                                       ("dB = s * (rows_dy.T @ rows_u)", "dB = rows_dy.T @ rows_u")],
     BACKWARD, "dx differs"),
    ("lora", "the scaling counted twice in dA", [("dA = du.T @ rows_x", "dA = s * du.T @ rows_x")], BACKWARD,
     "(dx, dB match.)"),
    ("lora", "dB transposed", [("dB = s * (rows_dy.T @ rows_u)", "dB = s * (rows_u.T @ rows_dy)")], SHAPES,
     "dB of shape (2, 4)"),
    ("lora", "dA for 2-D inputs only", [("dA = du.T @ rows_x", "dA = du.T @ x")], EDGE,
     "edge case 'batch axes'"),
    ("lora", "dx not given the shape of x", [("dx = (du @ A).reshape(x.shape)", "dx = du @ A")], EDGE,
     "dx has shape (6, 6); (2, 3, 6) is expected"),
    ("lora", "B A formed in the forward", [("y = scaling * (u @ B.T)", "y = scaling * (x @ (B @ A).T)")],
     "the product B A never formed", "lora_forward with d_in = d_out = 1024 and r = 4 allocated 8.0 MiB"),
    ("lora", "dx through B A", [("dx = (du @ A).reshape(x.shape)", "dx = s * (dy @ (B @ A))")],
     "the product B A never formed", "lora_backward with d_in = d_out = 1024"),
    ("cross_entropy", "ignored targets overwritten in the caller's array",
     [("    t = np.asarray(targets).reshape(-1)\n    keep = t != ignore_index\n    t = np.where(keep, t, 0)\n",
       "    t = targets.reshape(-1)\n    keep = t != ignore_index\n    t[~keep] = 0\n")], EDGE,
     "changed its argument targets in place"),
    ("rms_norm", "dgamma summed over two batch axes only",
     [("dgamma = (dy * xhat).reshape(-1, d).sum(axis=0)", "dgamma = (dy * xhat).sum(axis=(0, 1))")], FD,
     "returns dgamma of shape"),
    ("dropout", "kept entries multiplied by 1 - p", [("mask = (rng.random(x.shape) >= p) / (1 - p)",
                                                     "mask = (rng.random(x.shape) >= p) * (1 - p)")],
     "forward: zeroed with probability p, the rest scaled", "y[0, 0] = 0.0880112 for x[0, 0]"),
    ("bpe_merge", "ties broken by the first pair counted (max(stats, key=stats.get))",
     [("best = min(stats, key=lambda p: (-stats[p], p[0], p[1]))", "best = max(stats, key=stats.get)")],
     "ties, as ByteLevelBPE breaks them", "the smallest left id, then the smallest right id"),
    ("bpe_merge", "ties broken by the largest ids", [("(-stats[p], p[0], p[1])", "(-stats[p], -p[0], -p[1])")],
     "ties, as ByteLevelBPE breaks them", "returned ((5, 3), 2); the reference returns ((2, 4), 2)"),
    ("bpe_merge", "each word counted once", [("stats.get((a, b), 0) + n", "stats.get((a, b), 0) + 1")],
     "counting pairs", "counts as often as its word occurs"),
    ("bpe_merge", "a pair counted once per word", [("for a, b in zip(word, word[1:])", "for a, b in set(zip(word, word[1:]))")],
     EDGE, "edge case 'overlapping pairs'"),
    ("bpe_merge", "the merged pair's second id not skipped", [("            i += 2\n", "            i += 1\n")],
     "merging a pair", "returned [104, 101, 256, 108, 111]"),
    ("bpe_merge", "no guard for words without pairs", [("    if not stats:\n        return None, 0\n", "")],
     EDGE, "edge case 'no pairs'"),
    ("bpe_merge", "the word merged in place", [("    out = []\n    i = 0\n", "    out = word\n    i = 0\n    word = list(word)\n    out.clear()\n")],
     "types, and no argument changed", "changed the word it was given"),
]


def patches_of(name, mistake):
    """The patches of the mistake ``mistake`` of exercise ``name`` in MISTAKES."""
    return next(m[2] for m in MISTAKES if m[:2] == (name, mistake))


def solution(name):
    return (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8")


def write_mistake(tmp_path, name, patches):
    text = solution(name)
    for old, new in patches:
        assert old in text, f"the solution of {name} no longer contains {old!r}: update MISTAKES"
        text = text.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", list(E.EXERCISES))
def test_numformer_ops_pass_their_exercise(name):
    exercise = E.EXERCISES[name]
    report = E.check(exercise, vars(exercise.reference))
    assert report.ok, report.message


@pytest.mark.parametrize("name", list(E.EXERCISES))
def test_a_learners_solution_passes(name):
    report = E.check_file(name, SOLUTIONS / f"{name}.py")
    assert report.ok, E.format_report(report, name)


@pytest.mark.parametrize("name", list(E.EXERCISES))
def test_the_stub_fails_as_shipped(name, tmp_path):
    path = E.write_stub(name, tmp_path)
    text = path.read_text(encoding="utf-8")
    assert "TODO" in text and "NotImplementedError" in text
    for function in E.EXERCISES[name].functions:        # the signature and the docstring, never the solution
        assert f"def {function.name}(" in text and function.doc.splitlines()[0] in text
    report = E.check_file(name, path)
    assert not report.ok
    assert report.passed == [SIGNATURE] and "not written yet" in report.message


@pytest.mark.parametrize("name, mistake, patches, step, fragment", MISTAKES,
                         ids=[f"{m[0]}: {m[1]}" for m in MISTAKES])
def test_a_typical_mistake_fails_where_it_should(name, mistake, patches, step, fragment, tmp_path):
    report = E.check_file(name, write_mistake(tmp_path, name, patches))
    assert report.failed == step, f"{mistake}: failed at {report.failed!r}, not {step!r}:\n{report.message}"
    assert fragment in report.message, f"{mistake}: {fragment!r} is not in the message:\n{report.message}"


def test_an_output_none_on_both_sides_is_not_called_a_match(tmp_path):
    """need_weights=False: the weights are None in both; a wrong output is not followed by '(weights matches.)'."""
    report = E.check_file("scaled_dot_product_attention", write_mistake(
        tmp_path, "scaled_dot_product_attention", [("scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / q.shape[-1]")]))
    assert not report.ok and "weights match" not in report.message, report.message


# (exercise, what the learner wrote, [(text of the solution, what the learner wrote instead)]): not the
# reference's signature, and right: every call the model and the grader make calls it as it calls the reference
SIGNATURES_THAT_PASS = [
    ("adamw", "betas a list", [("betas=(0.9, 0.999)", "betas=[0.9, 0.999]")]),
    ("adamw", "the moments named m and v", [("exp_avg, exp_avg_sq, step, lr", "m, v, step, lr"),
                                            ("    exp_avg *= beta1\n", "    exp_avg, exp_avg_sq = m, v\n"
                                                                       "    exp_avg *= beta1\n")]),
    ("scaled_dot_product_attention", "backward(dy, cache) for backward(dout, cache)",
     [("_backward(dout, cache):", "_backward(dy, cache):"), ("    q, k, v, p,", "    dout = dy\n    q, k, v, p,")]),
    ("softmax", "backward(grad, saved, /), positional-only",
     [("def softmax_backward(dy, cache):\n    y, axis = cache\n",
       "def softmax_backward(grad, saved, /):\n    dy, (y, axis) = grad, saved\n")]),
    ("cross_entropy", "backward(c, g=1.0)", [("def cross_entropy_backward(cache, dloss=1.0):",
                                               "def cross_entropy_backward(c, g=1.0):\n    cache, dloss = c, g")]),
    ("linear", "a default for the cache", [("def linear_backward(dy, cache, weight_grad=True):",
                                            "def linear_backward(dy, cache=None, weight_grad=True):")]),
    ("bpe_merge", "merge_pair(ids, p, new)",
     [("def merge_pair(word, pair, new_id)", "def merge_pair(ids, p, new)"),
      ("    out = []\n", "    word, pair, new_id = ids, p, new\n    out = []\n")]),
]


@pytest.mark.parametrize("name, change, patches", SIGNATURES_THAT_PASS,
                         ids=[f"{s[0]}: {s[1]}" for s in SIGNATURES_THAT_PASS])
def test_a_signature_every_caller_calls_alike_passes(name, change, patches, tmp_path):
    report = E.check_file(name, write_mistake(tmp_path, name, patches))
    assert report.ok, E.format_report(report, f"{name}.py")


def _recording_learner(exercises, calls):
    """A training.Learner of the reference functions of ``exercises``, each recording (positional arguments,
    keyword names) of every call into ``calls`` (function name -> list)."""
    def recorded(name, function):
        def run(*args, **kwargs):
            calls.setdefault(name, []).append((len(args), set(kwargs)))
            return function(*args, **kwargs)
        return run
    functions = {e.name: {n: recorded(n, f) for n, f in e.reference_functions().items()} for e in exercises}
    return training.Learner(functions, {e.name: f"{e.name}.py" for e in exercises})


@pytest.mark.parametrize("model, overrides", [("gpt", ["model.bias=true", "model.dropout=0.1"]),
                                              ("gpt", ["model.activation=relu2", "model.tie_weights=false"]),
                                              ("llama", [])])
def test_no_caller_names_a_parameter_the_signature_step_lets_a_learner_rename(model, overrides):
    """The signature step lets a learner rename a function's first ``by_position`` parameters (a backward's dy
    and cache): a training step of the model passes each op only by position there, and the grader too
    (``run_backward``)."""
    exercises = [e for e in E.EXERCISES.values() if e.in_model or e.route]
    calls = {}
    config, task = training.configure(model, [*SMALL, *overrides])
    training.Run(config, task, _recording_learner(exercises, calls)).step()
    for exercise in exercises:
        for name, reference in exercise.reference_functions().items():
            free = list(inspect.signature(reference).parameters)[:exercise.by_position(name)]
            for positional, keywords in calls.get(name, []):
                assert positional >= len(free) and not keywords & set(free), (name, positional, keywords)
    assert {"linear_backward", "scaled_dot_product_attention_backward", "cross_entropy_backward",
            "adamw_step"} <= set(calls), sorted(calls)


def test_numpy_integers_are_integers_to_the_bpe_grader(tmp_path):
    """A correct most_frequent_pair written with NumPy returns NumPy integers: that is no mistake."""
    text = solution("bpe_merge").replace("    return best, stats[best]",
                                         "    return (np.int64(best[0]), np.int64(best[1])), np.int64(stats[best])")
    assert "np.int64(best[0])" in text
    path = tmp_path / "bpe_merge.py"
    path.write_text("import numpy as np\n" + text, encoding="utf-8")
    report = E.check_file("bpe_merge", path)
    assert report.ok, report.message


def test_every_exercise_has_two_typical_mistakes():
    counts = {name: sum(m[0] == name for m in MISTAKES) for name in E.EXERCISES}
    assert min(counts.values()) >= 2, counts


def _differs(value, default):
    if isinstance(value, np.ndarray) or isinstance(default, np.ndarray):
        return value is not default
    try:
        return bool(value != default)
    except (TypeError, ValueError):                   # a Generator, a RopeScaling ...
        return value is not default


@pytest.mark.parametrize("name", [n for n, e in E.EXERCISES.items() if e.case is not None])
def test_every_keyword_argument_is_graded_at_another_value_than_its_default(name):
    """Issue 41: every keyword argument of the signature at a non-default value in some case (a forward's keyword
    among a case's inputs, a backward's among its backward_options; cross_entropy's dloss is the upstream
    gradient the grader passes to every call)."""
    exercise = E.EXERCISES[name]
    forward, backward = (exercise.reference_functions()[n] for n in exercise.names)
    cases = [exercise.case, *exercise.edge_cases, *exercise.keyword_cases]
    if name == "scaled_dot_product_attention":        # its own keyword step adds the dropout case
        from numformer.exercises.catalog import scaled_dot_product_attention as sdpa
        assert "dropout_p=p, rng=NewRng(" in inspect.getsource(sdpa._dropout_case)
        cases += [sdpa._dropout_case(p) for p in sdpa.DROPOUT_RATES]
    inputs = [case.inputs() for case in cases]
    for p in inspect.signature(forward).parameters.values():
        if p.default is not inspect.Parameter.empty:
            assert any(_differs(i.get(p.name, p.default), p.default) for i in inputs), \
                f"{name}: no case sets {forward.__name__}'s {p.name} to another value than {p.default!r}"
    upstream = exercise.calls.cache_first and list(inspect.signature(backward).parameters)[1]
    for p in inspect.signature(backward).parameters.values():
        if p.default is not inspect.Parameter.empty and p.name != upstream:
            assert any(_differs(dict(c.backward_options).get(p.name, p.default), p.default) for c in cases), \
                f"{name}: no case calls {backward.__name__} with {p.name} other than {p.default!r}"


def test_adamws_keyword_cases_set_every_keyword():
    from numformer.exercises.catalog import adamw

    defaults = {p.name for p in inspect.signature(E.EXERCISES["adamw"].reference_functions()["adamw_step"])
                .parameters.values() if p.default is not inspect.Parameter.empty}
    assert defaults == {k for options in adamw.KEYWORDS for k in options}


def test_a_failure_says_where_without_the_code(tmp_path):
    report = E.check_file("layer_norm", write_mistake(tmp_path, "layer_norm", patches_of("layer_norm", "eps outside the square root")))
    text = " ".join(E.format_report(report, "layer_norm.py").split())
    assert "3. forward against the reference" in text and "FAILED" in text
    assert "most at y[" in text and "relative to its largest entry" in text
    assert "hint layer_norm" in text and "np.sqrt" not in text


def test_a_file_that_does_not_run_fails_the_first_step(tmp_path):
    (tmp_path / "bad.py").write_text("import numpy as np\n\ndef layer_norm_forward(x:\n", encoding="utf-8")
    report = E.check_file("layer_norm", tmp_path / "bad.py")
    assert report.failed == SIGNATURE and "line 3" in report.message
    (tmp_path / "bad.py").write_text("def layer_norm_forward(x, gamma, beta, eps=1e-6):\n    pass\n"
                                     "def layer_norm_backward(dy, cache):\n    pass\n", encoding="utf-8")
    report = E.check_file("layer_norm", tmp_path / "bad.py")
    assert report.failed == SIGNATURE and "eps=1e-05" in report.message


# -- numformer's own code is refused, before the file runs ------------------------------------------------------
RAN = "open(__file__ + '.ran', 'w').close()\n"       # line 2 of every file below: it leaves a mark when it runs
SOFTMAX_BY_NAME = "softmax_forward, softmax_backward = ops.softmax_forward, ops.softmax_backward\n"

# (form, exercise, the file after its lines 1-2, the line the refusal names, the code shown there); a helper file
# beside the learner's is written from HELPER
NUMFORMER_IMPORTS = [
    ("from numformer.ops import", "softmax",
     "from numformer.ops import softmax_forward, softmax_backward\n", 3,
     "from numformer.ops import softmax_forward, softmax_backward"),
    ("from numformer import ops", "softmax", "from numformer import ops\n" + SOFTMAX_BY_NAME, 3,
     "from numformer import ops"),
    ("import numformer.ops in a function body", "softmax",
     "def softmax_forward(x, axis=-1):\n    import numformer.ops\n    return numformer.ops.softmax_forward(x, axis)\n"
     "\n\ndef softmax_backward(dy, cache):\n    import numformer.ops as o\n    return o.softmax_backward(dy, cache)\n",
     4, "import numformer.ops"),
    ("import numformer.kernels", "layer_norm",
     "import numformer.kernels\nlayer_norm_forward = numformer.kernels.layer_norm_forward\n"
     "layer_norm_backward = numformer.kernels.layer_norm_backward\n", 3, "import numformer.kernels"),
    ("from numformer.optim import (a custom-steps exercise)", "adamw", "from numformer.optim import adamw_step\n",
     3, "from numformer.optim import adamw_step"),
    ("__import__", "softmax", "ops = __import__('numformer.ops', fromlist=['softmax_forward'])\n" + SOFTMAX_BY_NAME,
     3, "ops = __import__('numformer.ops', fromlist=['softmax_forward'])"),
    ("importlib.import_module", "softmax",
     "import importlib\n\nops = importlib.import_module('numformer.ops')\n" + SOFTMAX_BY_NAME, 5,
     "ops = importlib.import_module('numformer.ops')"),
    ("import_module under another name", "softmax",
     "from importlib import import_module as load\n\nops = load(name='numformer.ops')\n" + SOFTMAX_BY_NAME, 5,
     "ops = load(name='numformer.ops')"),
    ("importlib.util.find_spec", "softmax",
     "import importlib.util as u\nspec = u.find_spec('numformer.ops')\nops = u.module_from_spec(spec)\n"
     "spec.loader.exec_module(ops)\n" + SOFTMAX_BY_NAME, 4, "spec = u.find_spec('numformer.ops')"),
    ("sys.modules", "softmax", "import sys\nops = sys.modules['numformer.ops']\n" + SOFTMAX_BY_NAME, 4,
     "ops = sys.modules['numformer.ops']"),
    ("a helper file beside it", "softmax", "from helper import softmax_forward, softmax_backward\n", 1,
     "from numformer.ops import softmax_backward, softmax_forward"),
    ("__import__ under another name", "softmax",
     "imp = __import__\nops = imp('numformer.ops', fromlist=['x'])\n" + SOFTMAX_BY_NAME, 4,
     "ops = imp('numformer.ops', fromlist=['x'])"),
    ("getattr(__builtins__, ...)", "softmax",
     "ops = getattr(__builtins__, '__import__')('numformer.ops', None, None, ['x'])\n" + SOFTMAX_BY_NAME, 3,
     "ops = getattr(__builtins__, '__import__')('numformer.ops', None, None, ['x'])"),
    ("exec of an import", "softmax", "exec('import numformer.ops as ops')\n" + SOFTMAX_BY_NAME, 3,
     "exec('import numformer.ops as ops')"),
    ("pkgutil.resolve_name", "softmax", "import pkgutil\nops = pkgutil.resolve_name('numformer.ops')\n"
     + SOFTMAX_BY_NAME, 4, "ops = pkgutil.resolve_name('numformer.ops')"),
    ("dict.get of sys.modules", "softmax", "import sys\nops = dict.get(sys.modules, 'numformer.ops')\n"
     + SOFTMAX_BY_NAME, 4, "ops = dict.get(sys.modules, 'numformer.ops')"),
    ("a helper file loaded by name", "softmax",
     "h = __import__('helper')\nsoftmax_forward, softmax_backward = h.softmax_forward, h.softmax_backward\n", 1,
     "from numformer.ops import softmax_backward, softmax_forward"),
]
HELPER = "from numformer.ops import softmax_backward, softmax_forward\n"


@pytest.mark.parametrize("form, name, text, line, code", NUMFORMER_IMPORTS, ids=[f[0] for f in NUMFORMER_IMPORTS])
def test_a_file_that_imports_numformers_op_is_refused(form, name, text, line, code, tmp_path):
    """Every way of importing numformer's own op fails the first step with one message naming the line and what to
    do, before the file runs (it leaves no mark), and the grade is a failure, not an exception."""
    (tmp_path / "helper.py").write_text(HELPER, encoding="utf-8")
    path = tmp_path / f"{name}.py"
    path.write_text("import numpy as np\n" + RAN + text, encoding="utf-8")
    report = E.check_file(name, path)
    assert report.failed == SIGNATURE and report.passed == [], (form, report)
    assert f", line {line}: `{code}` imports" in report.message or f", line {line}: `{code}` takes" in report.message, \
        report.message
    assert "Remove that import and write the function yourself with NumPy and the standard library" in report.message
    assert not Path(f"{path}.ran").exists(), "the file ran before it was refused"
    assert "FAILED" in E.format_report(report, path) and report.message.splitlines()[0][:40] in \
        " ".join(E.format_report(report, path).split())
    if form.startswith("a helper file"):
        assert f"{tmp_path / 'helper.py'} (a file {name}.py imports), line 1" in report.message


def test_the_command_refuses_numformers_op_with_one_message(tmp_path):
    """``check`` exits 1 with the refusal in its report; ``train`` refuses the file with one error line."""
    (tmp_path / "softmax.py").write_text("import numpy as np\nfrom numformer.ops import softmax_forward, "
                                         "softmax_backward\n", encoding="utf-8")
    checked = numformer("exercises", "check", "softmax", "softmax.py", cwd=tmp_path)
    out = " ".join(checked.stdout.split())
    assert checked.returncode == 1 and "Traceback" not in checked.stdout + checked.stderr
    assert "1. import and signature .................. FAILED" in out
    assert "softmax.py, line 2: `from numformer.ops import softmax_forward, softmax_backward` imports" in out
    (tmp_path / "layer_norm.py").write_text("import numformer.kernels as K\nlayer_norm_forward = K.layer_norm_forward"
                                            "\nlayer_norm_backward = K.layer_norm_backward\n", encoding="utf-8")
    trained = numformer("exercises", "train", "layer_norm.py", "--steps", "2", cwd=tmp_path)
    assert trained.returncode == 2 and "Traceback" not in trained.stderr and trained.stderr.count("\n") == 1
    assert "layer_norm.py, line 1: `import numformer.kernels as K` imports numformer.kernels" in trained.stderr


@pytest.mark.parametrize("name", ["gelu", "rope"])          # the exercises whose docstrings name a helper
def test_the_stubs_own_import_of_numformer_passes_and_no_other_name(name, tmp_path):
    """The stub of gelu imports numformer.ops.erf, rope's RopeScaling and rope_inverse_frequencies: a solution with
    exactly that import passes (and runs); one more name from numformer is refused, and so is the same import in
    another exercise's file."""
    given = [line for line in E.stub_text(E.EXERCISES[name]).splitlines() if line.startswith("from numformer")]
    assert given, f"the stub of {name} imports none of the helpers its docstrings name"
    path = tmp_path / f"{name}.py"
    path.write_text("\n".join([RAN.rstrip("\n"), *given, solution(name)]), encoding="utf-8")
    report = E.check_file(name, path)
    assert report.ok and Path(f"{path}.ran").exists(), E.format_report(report, path)
    own = f"{name}_forward"
    path.write_text("\n".join([given[0] + f", {own}", solution(name)]), encoding="utf-8")
    report = E.check_file(name, path)
    assert report.failed == SIGNATURE and f"imports {own} from numformer.ops:" in report.message, report.message
    assert f"(from numformer, only what the stub imports: `{given[0]}`)" in report.message
    (tmp_path / "softmax.py").write_text(given[0] + "\n" + solution("softmax"), encoding="utf-8")
    report = E.check_file("softmax", tmp_path / "softmax.py")
    assert report.failed == SIGNATURE and "line 1" in report.message and "only what the stub" not in report.message


def test_hints_come_one_at_a_time_and_are_remembered(tmp_path):
    n = len(E.EXERCISES["rope"].hints)
    seen = [E.next_hint("rope", tmp_path)[0] for _ in range(n + 1)]
    assert seen == [*range(1, n + 1), n]
    assert json.loads((tmp_path / E.HINTS_FILE).read_text())["hints_seen"] == {"rope": n}
    assert E.next_hint("softmax", tmp_path)[:2] == (1, len(E.EXERCISES["softmax"].hints))


def test_hints_in_a_folder_of_their_own_name_it_in_the_next_command(tmp_path, capsys):
    """`hint --dir` makes its folder (as `start --dir` does) and says the command of the next hint with it."""
    from numformer.cli import main

    folder = tmp_path / "hints"
    assert main(["exercises", "hint", "rope", "--dir", str(folder)]) == 0
    assert (folder / E.HINTS_FILE).is_file()
    assert f"(`numformer exercises hint rope --dir {folder}` again for the next one)" in capsys.readouterr().out


def test_every_exercise_is_documented_and_hinted():
    docs = Path(__file__).resolve().parents[1] / "docs"
    for exercise in E.EXERCISES.values():
        assert exercise.hints and exercise.summary and exercise.page
        page, anchor = exercise.page.split("#")
        assert (docs / page).is_file(), f"{exercise.name}: no docs/{page}"
        assert f"| `{exercise.name}` |" in (docs / "exercises.md").read_text(encoding="utf-8"), exercise.name


def test_using_ops_installs_and_restores():
    mine = lambda x, W, b=None: (np.zeros(1), None)      # noqa: E731
    with dispatch.using_ops({"linear_forward": mine}):
        assert dispatch.F.linear_forward is mine
        with dispatch.reference_mode():
            assert dispatch.F.linear_forward is mine and dispatch.F.linear_backward is ops.linear_backward
    assert dispatch.F.linear_forward is not mine
    with pytest.raises(ValueError, match="no op 'linear_forwards'"):
        with dispatch.using_ops({"linear_forwards": mine}):
            pass


# a small model of the first GPT's configuration, for the tests that train (the page's session trains the real one)
SMALL = ["model.n_layers=1", "model.d_model=32", "data.block_size=32", "train.batch_size=4"]


def test_the_exercise_loop_is_the_trainers_step(tmp_path):
    """With the reference ops, ``exercises train``'s loop gives the Trainer's losses (float64, one process)."""
    from numformer import reference_mode
    from numformer.train import Trainer

    overrides = SMALL + ["train.max_steps=4", "train.log_every=1", "train.eval_every=100", "train.processes=1",
                         "data.val_fraction=0.01"]
    config, task = training.configure("gpt", overrides)
    run = training.Run(config, task)
    ours = [run.step() for _ in range(4)]
    with reference_mode():
        Trainer(config, tmp_path / "run", quiet=True).train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    theirs = [r["train_loss"] for r in lines if "train_loss" in r]
    assert np.allclose(ours, theirs, rtol=0, atol=1e-12), (ours, theirs)


def test_train_on_a_learners_ops_follows_the_library(capsys):
    files = [SOLUTIONS / f"{n}.py" for n in ("linear", "layer_norm", "embedding", "gelu", "cross_entropy",
                                             "scaled_dot_product_attention", "adamw", "softmax")]
    assert training.train(files, steps=3, every=1, overrides=SMALL) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Your ops in the model: adamw, cross_entropy, embedding, gelu, layer_norm, linear, " \
           "scaled_dot_product_attention; not called by this model: softmax" in out
    assert "equals the library's" in out


def test_train_refuses_an_op_that_fails_its_check(tmp_path, capsys):
    path = write_mistake(tmp_path, "layer_norm", patches_of("layer_norm", "eps outside the square root"))
    assert training.train([path], steps=2, overrides=SMALL) == 1
    assert "Fix layer_norm first" in " ".join(capsys.readouterr().out.split())


def test_train_finds_where_the_curves_part(tmp_path, capsys):
    """An op right on the check's inputs (d = 8) and wrong at the model's width (d = 32) parts the curves."""
    text = solution("layer_norm").replace("    return y, (xhat, r, gamma)",
                                          "    if x.shape[-1] == 32:\n        y = y + 1e-7\n"
                                          "    return y, (xhat, r, gamma)")
    (tmp_path / "layer_norm.py").write_text(text, encoding="utf-8")
    assert training.train([tmp_path / "layer_norm.py"], steps=2, every=1, overrides=SMALL) == 1
    assert "The curves part at step 1" in " ".join(capsys.readouterr().out.split())


def test_train_names_an_op_that_fails_on_the_models_inputs(tmp_path, capsys):
    """An op that passes its check and raises at the model's width: one message naming the step, the error and
    the learner's line, and exit code 1 (before: numformer's "internal error ... a bug in numformer")."""
    text = solution("layer_norm").replace("    return y, (xhat, r, gamma)",
                                          "    if x.shape[-1] == 32:\n        raise ValueError('too wide')\n"
                                          "    return y, (xhat, r, gamma)")
    (tmp_path / "layer_norm.py").write_text(text, encoding="utf-8")
    assert training.train([tmp_path / "layer_norm.py"], steps=2, every=1, overrides=SMALL) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "Training on your ops stopped at step 1: the step raised ValueError: too wide at line" in said
    assert f"of {tmp_path / 'layer_norm.py'}: raise ValueError('too wide')" in said
    assert "The library's copy took that step" in said


def test_train_with_the_llama_model_uses_rope_and_rms_norm(capsys):
    files = [SOLUTIONS / f"{n}.py" for n in ("rope", "rms_norm", "repeat_kv", "swiglu")]
    assert training.train(files, steps=2, model="llama", every=1, overrides=SMALL) == 0
    assert "Your ops in the model: repeat_kv, rms_norm, rope; not called by this model: swiglu" in \
        " ".join(capsys.readouterr().out.split())


def test_train_with_dropout_on_says_the_random_draws_differ(capsys):
    """A correct dropout draws float64 uniforms where numformer draws float32 ones: with dropout on the curves
    part at once, and the message says why rather than blaming an untried input."""
    overrides = [*SMALL, "model.dropout=0.1"]
    assert training.train([SOLUTIONS / "dropout.py"], steps=2, every=1, overrides=overrides) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "with dropout on: your dropout draw(s) random masks of their own" in text
    assert "on inputs the checks did not try" not in text


def test_train_refuses_ops_the_model_does_not_call():
    with pytest.raises(ValueError, match=r"the gpt model calls none of your ops \(rms_norm, rope\).*--model llama"):
        training.train([SOLUTIONS / "rope.py", SOLUTIONS / "rms_norm.py"], steps=2, overrides=SMALL)
    with pytest.raises(ValueError, match=r"calls none of your ops \(softmax\).*checked, not trained"):
        training.train([SOLUTIONS / "softmax.py"], steps=2, overrides=SMALL)
    with pytest.raises(ValueError, match=r"calls none of your ops \(relu_squared\).*relu_squared: train with "
                                         r"--set model.activation=relu2$"):
        training.train([SOLUTIONS / "relu_squared.py"], steps=2, overrides=SMALL)


@pytest.mark.parametrize("name", list(E.EXERCISES))
def test_an_exercise_says_which_model_calls_it(name):
    """in_model and model agree with the calls a training step of that model makes (so the pass message sends
    the learner to a `numformer exercises train` that uses the op)."""
    exercise = E.EXERCISES[name]
    config, _ = training.configure(exercise.model, SMALL)
    used, _ = training.used_by(config["model"], training.find_ops([SOLUTIONS / f"{name}.py"]))
    assert (used == [name]) == exercise.in_model, (name, exercise.model, used)


@pytest.mark.parametrize("name", [n for n, e in E.EXERCISES.items() if e.route])
def test_an_op_outside_the_models_is_trained_by_its_route(name, capsys):
    """The --set item an exercise names (in the pass message and in train's refusal) makes the model call the
    op, and the learner's op then trains it."""
    exercise = E.EXERCISES[name]
    report = E.check_file(name, SOLUTIONS / f"{name}.py")
    assert f"numformer exercises train {name}.py --set {exercise.route}" in \
        " ".join(E.format_report(report, f"{name}.py").split())
    overrides = [*SMALL, exercise.route]
    config, _ = training.configure(exercise.model, overrides)
    assert training.used_by(config["model"], training.find_ops([SOLUTIONS / f"{name}.py"]))[0] == [name]
    assert training.train([SOLUTIONS / f"{name}.py"], steps=2, model=exercise.model, overrides=overrides) == 0
    assert f"Your ops in the model: {name}" in capsys.readouterr().out


def numformer(*args, cwd):
    return subprocess.run([sys.executable, "-m", "numformer.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_the_command_line_session(tmp_path):
    """list, start, check (failing, then passing), hint, and the errors of bad input."""
    listed = numformer("exercises", "list", cwd=tmp_path)
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert listed.returncode == 0 and names == list(E.EXERCISES)
    assert max(map(len, listed.stdout.splitlines())) <= E.WIDTH
    assert numformer("exercises", "start", "rms_norm", "--dir", "ex", cwd=tmp_path).returncode == 0
    failing = numformer("exercises", "check", "rms_norm", "ex/rms_norm.py", cwd=tmp_path)
    assert failing.returncode == 1 and "FAILED" in failing.stdout
    hint = numformer("exercises", "hint", "rms_norm", cwd=tmp_path)
    assert hint.returncode == 0 and hint.stdout.startswith("Hint 1 of")
    again = numformer("exercises", "start", "rms_norm", "--dir", "ex", cwd=tmp_path)
    assert again.returncode == 2 and "exists (your work so far?)" in again.stderr
    (tmp_path / "ex" / "rms_norm.py").write_text(solution("rms_norm"), encoding="utf-8")
    passing = numformer("exercises", "check", "rms_norm", "ex/rms_norm.py", cwd=tmp_path)
    assert passing.returncode == 0 and passing.stdout.count(" ok") == 7
    unknown = numformer("exercises", "check", "layernorm", "ex/rms_norm.py", cwd=tmp_path)
    assert unknown.returncode == 2 and "no exercise 'layernorm' (did you mean 'layer_norm'?)" in unknown.stderr
    missing = numformer("exercises", "check", "rms_norm", "ex/nothing.py", cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "emptydir").mkdir()
    folder = numformer("exercises", "check", "rms_norm", "emptydir", cwd=tmp_path)
    assert folder.returncode == 2 and folder.stderr.count("\n") == 1
    assert "emptydir is a folder; give the .py file of your solution (e.g. emptydir/rms_norm.py)" in folder.stderr
    (tmp_path / "notes.md").write_text("# my notes\n", encoding="utf-8")
    not_python = numformer("exercises", "check", "rms_norm", "notes.md", cwd=tmp_path)
    assert not_python.returncode == 1 and "notes.md is not a Python file" in not_python.stdout
    (tmp_path / "broken.py").write_text("def rms_norm_forward(x:\n", encoding="utf-8")
    for bad, says in (("notes.md", "is not a Python file"), ("broken.py", "is not valid Python")):
        train = numformer("exercises", "train", bad, "--steps", "2", cwd=tmp_path)
        assert train.returncode == 2 and says in train.stderr and "Traceback" not in train.stderr
        assert train.stderr.count("\n") == 1


# -- the session of docs/exercises.md, replayed -----------------------------------------------------------------
PAGE = Path(__file__).resolve().parents[1] / "docs" / "exercises.md"
BLOCK = re.compile(r"^( *)```(console|python)\n(.*?)^\1```", re.S | re.M)


def session_steps():
    """[("file", text) | ("run", command, expected output)] of the page's session, in order: each python block is
    the learner's ex/layer_norm.py from there on; each console block, its commands and what they print."""
    text = PAGE.read_text(encoding="utf-8")
    text = text[text.index("### A session"):text.index("### Adding an exercise")]
    steps = []
    for indent, kind, body in BLOCK.findall(text):
        body = "\n".join(line[len(indent):] for line in body.splitlines())
        if kind == "python":
            steps.append(("file", body + "\n"))
            continue
        for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
            command, _, output = chunk.partition("\n")
            steps.append(("run", command, output.rstrip("\n")))
    return steps


def replay(tmp_path, steps=None):
    """Run the session in tmp_path; ``steps`` replaces the training's 300 steps (its output is then compared up to
    the first step's line, whitespace normalized)."""
    ran = 0
    for step in session_steps():
        if step[0] == "file":
            (tmp_path / "ex").mkdir(exist_ok=True)
            (tmp_path / "ex" / "layer_norm.py").write_text(step[1], encoding="utf-8")
            continue
        _, command, expected = step
        args = command.split()[1:]
        done = numformer(*args, *(["--steps", str(steps)] if args[:2] == ["exercises", "train"] and steps else []),
                         cwd=tmp_path)
        got = done.stdout.rstrip("\n")
        if args[:2] == ["exercises", "train"]:
            got, expected = (_rounding_as_zero(text) for text in (got, expected))
        if args[:2] == ["exercises", "train"] and steps:
            got, expected = (_to_first_step(text) for text in (got, expected))
            got = got.replace(f"for {steps} steps", "for 300 steps")
        assert got == expected, f"`{command}` printed:\n{got}\n\nthe page shows:\n{expected}"
        ran += 1
    return ran


def _rounding_as_zero(text):
    """The training's output with each difference of the two curves below 1e-13 written "0 (rounding)": which
    steps round apart in the last bit (8.9e-16) depends on the CPU's BLAS kernels, not on the code, and the
    page's session was run on another machine."""
    def zero(m):
        return m.group(1) + "0 (rounding)" if float(m.group(2)) < 1e-13 else m.group(0)
    text = re.sub(r"(\d\.\d{12}\s+)(\d\.\de[-+]\d\d)$", zero, text, flags=re.M)
    return re.sub(r"(equals the library's to )(\d\.\de[-+]\d\d)", zero, text)


def test_rounding_in_the_training_output_is_not_compared():
    a = "    75      2.681011444751      2.681011444751     8.9e-16\n   300      2.362141354764      2.362241354764     1.0e-04\n" \
        "Your ops trained the GPT: its loss equals the library's to 1.3e-15 at every one of the"
    b = a.replace("8.9e-16", "0.0e+00").replace("1.3e-15", "8.9e-16")
    assert _rounding_as_zero(a) == _rounding_as_zero(b) and "1.0e-04" in _rounding_as_zero(a)


def _to_first_step(text):
    """The training's output up to its first step's line, whitespace normalized."""
    lines = text.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith("     1 "))
    return " ".join(" ".join(lines[:first + 1]).split())


def test_the_session_on_the_exercises_page(tmp_path):
    """Every command of the page's session prints what the page shows (the training's first step only)."""
    assert replay(tmp_path, steps=1) == 6


@pytest.mark.slow
def test_the_whole_session_on_the_exercises_page(tmp_path):
    """The same with the 300 training steps the page shows."""
    assert replay(tmp_path) == 6


# -- the grader's oracle on the grader's own inputs, against torch ----------------------------------------------
def _torch_functions():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    return torch, {
        "softmax": lambda x, axis=-1: torch.softmax(x, dim=axis),
        "log_softmax": lambda x, axis=-1: torch.log_softmax(x, dim=axis),
        "linear": lambda x, W, b=None: F.linear(x, W, b),
        "gelu": lambda x, approximate="none": F.gelu(x, approximate=approximate),
        "relu_squared": lambda x: torch.relu(x).square(),
        "layer_norm": lambda x, gamma, beta, eps=1e-5: F.layer_norm(x, x.shape[-1:], gamma, beta, eps),
        "rms_norm": lambda x, gamma, eps=1e-6: F.rms_norm(x, x.shape[-1:], gamma, eps),
        "cross_entropy": lambda logits, targets, ignore_index=-100, label_smoothing=0.0: F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index,
            label_smoothing=label_smoothing),
        "scaled_dot_product_attention": lambda q, k, v, attn_mask=None, is_causal=False, scale=None,
        need_weights=False, softcap=None: _torch_attention(torch, q, k, v, attn_mask, is_causal, scale)
        if softcap is None else _capped_attention(torch, q, k, v, attn_mask, is_causal, scale, softcap),
    }


def _torch_attention(torch, q, k, v, attn_mask, is_causal, scale):
    """torch's attention, whose is_causal refuses an attn_mask beside it: both as one mask then (boolean, or a
    float mask with -inf after query i's keys)."""
    if is_causal and attn_mask is not None:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        attn_mask = attn_mask & causal if attn_mask.dtype == torch.bool else \
            attn_mask.masked_fill(~causal, float("-inf"))
        is_causal = False
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                            scale=scale)


def _capped_attention(torch, q, k, v, attn_mask, is_causal, scale, cap):
    """Soft-capped attention written out in torch (its scaled_dot_product_attention has no soft-cap; Gemma 2's
    modeling code computes it this way): S = c·tanh(Q Kᵀ · scale / c), then the masks, softmax, times V."""
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    scores = cap * torch.tanh(scores / cap)
    if attn_mask is not None:           # a float mask added after the cap, as Gemma 2's eager attention adds it
        scores = scores + attn_mask if attn_mask.dtype != torch.bool else \
            scores.masked_fill(~attn_mask, float("-inf"))
    if is_causal:
        blocked = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(blocked, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _cases_with_a_torch_twin():
    skip = {"masked entries", "a fully masked slice", "a fully masked row", "every target ignored"}   # torch: NaN
    return [(name, case) for name in ("softmax", "log_softmax", "linear", "gelu", "relu_squared", "layer_norm",
                                      "rms_norm", "cross_entropy", "scaled_dot_product_attention")
            for case in (E.EXERCISES[name].case, *E.EXERCISES[name].edge_cases, *E.EXERCISES[name].keyword_cases)
            if case.name not in skip and not case.raises]       # torch refuses those too


@pytest.mark.parametrize("name, case", _cases_with_a_torch_twin(), ids=lambda v: getattr(v, "name", v))
def test_the_graders_reference_agrees_with_torch_on_its_cases(name, case):
    """Every input the grader compares a learner's op on, the reference gives torch's forward and gradients
    (float64; the cases where numformer returns 0 and torch NaN are left out)."""
    torch, functions = _torch_functions()
    exercise = E.EXERCISES[name]
    inputs = case.inputs()
    with np.errstate(over="ignore"):            # relu_squared's large inputs: x² overflows to inf, as in torch
        outputs, cache = E.checker.run_forward(exercise, vars(exercise.reference), inputs, learner=False)
    upstream = E.checker.upstream_for(outputs, exercise)
    grads = E.checker.run_backward(exercise, vars(exercise.reference), cache, dict(upstream), learner=False)
    tensors = {k: torch.from_numpy(np.array(v)).requires_grad_(k in grads and v is not None and v.dtype.kind == "f")
               if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    first = exercise.calls.differentiable[0]
    out = functions[name](**tensors)
    out.backward(torch.tensor(upstream[first], dtype=out.dtype).expand_as(out) if out.ndim == 0 else
                 torch.from_numpy(upstream[first]))
    np.testing.assert_allclose(np.asarray(outputs[first]), out.detach().numpy(), rtol=1e-10, atol=1e-10)
    for k, g in grads.items():
        if g is not None and isinstance(tensors.get(k), torch.Tensor):
            np.testing.assert_allclose(g, tensors[k].grad.numpy(), rtol=1e-9, atol=1e-10, err_msg=f"d{k}")
