"""numformer bench PART [PART ...] [--quick] [--out DIR] [--run-dir RUN_DIR] [--overwrite] [--quantize int8]
[--group-size G]: run benchmark parts, write bench.json and bench.md into results/ (or --out)."""
from __future__ import annotations


def run(args):
    from ..bench.runner import run_parts

    parts = [p.replace("-", "_") for p in args.parts]     # hf-generate names the part hf_generate
    run_parts(parts, quick=args.quick, out_dir=args.out,
              options={"run_dir": args.run_dir, "group_size": args.group_size, "quantize": args.quantize,
                       "overwrite": args.overwrite or None})


def register(sub):
    p = sub.add_parser("bench", help="benchmarks (throughput vs PyTorch, attention memory, ...); "
                                     "writes bench.json and bench.md into results/ (or --out)")
    p.add_argument("parts", nargs="+", metavar="PART",
                   help="a part of numformer.bench (throughput, op-families, attention, checkpointing, generate, "
                        "depth, hf-generate, llama-generate, qwen2-generate, qwen3-generate, gemma3-generate, "
                        "blas-kernels, tokenizer, mpi, mpi-scaling, quantize) or 'all'")
    p.add_argument("--quick", action="store_true", help="small smoke run (under a minute per part); "
                                                       "figures not for reporting")
    p.add_argument("--out", default="results", help="folder for bench.json, bench.md and figures/ (default results)")
    p.add_argument("--run-dir", default=None, metavar="RUN_DIR",
                   help="quantize: a trained speedrun run folder to measure the loss on (default: train one, for 10 "
                        "minutes or 15 s with --quick, into runs/bench_quantize_speedrun)")
    p.add_argument("--overwrite", action="store_true",
                   help="quantize without --run-dir: train the speedrun's model again into "
                        "runs/bench_quantize_speedrun (in the current folder) when that folder holds files")
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="generate: measure the model with int8 weights (written as the section generate_int8)")
    p.add_argument("--group-size", type=int, default=None,
                   help="quantize, and generate with --quantize: inputs per scale (default: one scale per output row)")
    p.set_defaults(func=run)
