"""Benchmarks: ``numformer bench PART [--quick]`` runs ``numformer.bench.<PART>``.

Each part module defines ``run(quick) -> dict`` and ``markdown(result, fig_dir) -> str``;
``numformer.bench.runner`` merges results into ``results/bench.json`` and writes
``results/bench.md``. PyTorch is imported only inside this package (the
reference model in ``torch_reference``), and only by the parts that compare.
"""
