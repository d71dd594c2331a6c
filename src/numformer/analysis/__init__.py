"""Look inside a model: attention maps, head statistics, ablations, position importance, figures.

For GPT, EncoderClassifier and Transformer alike::

    from numformer import analysis as A
    maps = A.attention_maps(model, ids)               # {group: (layers, B, heads, Tq, Tk)}
    maps.plot("self", tokens=labels, path="attn.png")
    stats = A.head_statistics(maps)                   # {group: {statistic: (layers, heads)}}
    result = A.head_ablation(model, metric)           # metric(model) -> float
    sal = A.gradient_x_input(model, ids)              # {input: (B, T)}
    A.write_report("report/", model, text="...", encode=..., decode_tokens=...)
    A.analyze_run("runs/copy")                        # the report of a run folder (numformer analyze)

A GPT's insides, as an interpretability researcher reads them (hook points: ``model.run_with_cache``)::

    A.logit_lens(model, ids).plot(tokens, path="lens.png")       # each layer's residual through the unembedding
    A.direct_logit_attribution(model, ids, tokens=answer).heads  # (B, L, H): each head's share of a logit
    A.activation_patching(model, clean, corrupted, A.LogitDifference(answer, wrong))   # (L, T) or per="head"
    A.attribution_patching(model, clean, corrupted, A.LogitDifference(answer, wrong))  # its gradient estimate
    A.head_scores(model).induction                               # (L, H) on repeated random tokens

Figures are matplotlib ``Figure`` objects drawn on the Agg canvas: no display is
needed, pyplot and the global backend are left alone, and a notebook shows a
returned figure inline. Every plotting function takes ``path=`` to write a PNG.
"""
from .ablation import AblationResult, ablate_heads, head_ablation, loss_metric, plot_head_ablation
from .attention import GROUP_TITLES, AttentionMaps, attention_maps, attention_modules, plot_attention
from .curves import (ema, eval_metric_names, plot_eval_metrics, plot_learning_rate, plot_loss_curves,
                     plot_runs_against_time, read_metrics, series)
from ._common import new_figure, save_figure
from .diagram import format_model_diagram, model_diagram, plot_model_diagram
from .heads import (SCORES, HeadScores, head_scores, in_context_score, per_position_loss, per_window_loss,
                    repeated_random_tokens, scores_from_patterns)
from .lens import LogitAttribution, LogitLens, direct_logit_attribution, logit_lens, plot_layer_head, unembed
from .patching import LogitDifference, PatchingResult, activation_patching, attribution_patching
from .positional import (dominant_wavelengths, plot_position_similarity, plot_positional_encoding,
                         plot_wavelengths, position_similarity, positional_tables, sinusoidal_wavelengths)
from .report import write_report
from .run_report import analyze_run
from .saliency import (LogitTarget, LossTarget, gradient_x_input, next_token_target, occlusion,
                       plot_position_importance)
from .stats import (STATISTICS, anti_diagonal_mass, entropy, first_token_mass, format_head_statistics,
                    head_statistics, mean_distance, plot_head_statistics, previous_token_mass, self_mass)

from types import ModuleType as _ModuleType

__all__ = [name for name, obj in dict(globals()).items()
           if not name.startswith("_") and not isinstance(obj, _ModuleType)]
