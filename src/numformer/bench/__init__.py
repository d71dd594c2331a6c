"""Benchmarks: ``numformer bench PART [--quick]`` runs ``numformer.bench.<PART>``.

Each part module defines ``run(quick) -> dict`` and ``markdown(result, fig_dir) -> str``;
``numformer.bench.runner`` merges results into ``results/bench.json`` and writes
``results/bench.md``. In this package PyTorch is imported only by the modules that compare with it
(``torch_reference``, which ``throughput`` uses, and the parts timing ``transformers``: ``hf_generate``,
``llama_generate``, ``_family`` and the family parts), inside their functions, so the other parts run
without it.
"""
