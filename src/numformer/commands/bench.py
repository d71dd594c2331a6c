"""numformer bench PART [PART ...] [--quick]: run benchmark parts, write results/bench.json and bench.md."""
from __future__ import annotations


def run(args):
    from ..bench.runner import run_parts

    parts = [p.replace("-", "_") for p in args.parts]     # hf-generate names the part hf_generate
    run_parts(parts, quick=args.quick, out_dir=args.out)


def register(sub):
    p = sub.add_parser("bench", help="benchmarks (throughput vs PyTorch, attention memory, ...); "
                                     "writes results/bench.json and results/bench.md")
    p.add_argument("parts", nargs="+", metavar="PART",
                   help="a part of numformer.bench (throughput, attention, checkpointing, generate, depth, "
                        "hf-generate, llama-generate, qwen2-generate, blas-kernels, mpi, mpi-scaling) or 'all'")
    p.add_argument("--quick", action="store_true", help="small smoke run (under a minute per part); "
                                                       "figures not for reporting")
    p.add_argument("--out", default="results", help="folder for bench.json, bench.md and figures/ (default results)")
    p.set_defaults(func=run)
