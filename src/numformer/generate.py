"""Sampling and decoding, one import away: ``numformer.sampling`` (logits processors, ``sample_next``) and
``numformer.decoding`` (GPT ``generate``; encoder-decoder ``greedy_decode``, ``sample_decode``,
``beam_search``). Read those modules; this one re-exports their names.
"""
from __future__ import annotations

from .decoding import beam_search, generate, greedy_decode, sample_decode
from .sampling import (apply_temperature, next_token_probabilities, sample_next, top_k_filter, top_p_filter,
                       warp_logits)

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "warp_logits", "next_token_probabilities",
           "sample_next", "generate", "greedy_decode", "sample_decode", "beam_search"]
