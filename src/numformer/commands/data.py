"""numformer data list | fetch NAME|all [--quiet]: the public datasets, where each file is, and downloading them.

Files are looked for in the data folder ($NUMFORMER_DATA), then the cache
($NUMFORMER_CACHE, else pooch's per-user cache); ``fetch`` leaves a file of the
data folder as it is, downloads what is missing into the cache and checks the
hash of every file it downloads or finds in the cache (see numformer.data.fetch).
"""
from __future__ import annotations


def run_list(args):
    from ..data import fetch as F

    data, cache = F.data_dir(), F.cache_dir()
    print(f"data folder: {data or '(none: set ' + F.DATA_ENV + ')'}")
    print(f"cache:       {cache or '(none: pip install pooch, or set ' + F.CACHE_ENV + ')'}")
    for name, ds in F.REGISTRY.items():
        rows = F.status(name)
        total = sum(f.size for f in ds.files)
        exact = all(f.exact_size for f in ds.files)
        state = _summary(rows)
        print(f"\n{name}: {ds.title}; {'' if exact else 'about '}{F.human_size(total)}; {state}")
        width = max(16, *(len(r["size"]) for r in rows))
        for r in rows:
            where = {"data folder": "in the data folder", "cache": "cached",
                     "stand-in": "stand-in in the data folder", "missing": "not here"}[r["where"]]
            print(f"  {r['path']:<34} {r['size']:>{width}}  {where:<28} {r['local'] or r['url']}")


def _summary(rows):
    kinds = {r["where"] for r in rows}
    if kinds == {"missing"}:
        return "not here (fetched on first use, or now with `numformer data fetch`)"
    if "missing" in kinds:
        return "partly here (the rest is fetched on first use)"
    return "ready" + (" (with a stand-in for a missing file)" if "stand-in" in kinds else "")


def run_fetch(args):
    from ..data import fetch as F

    names = list(F.REGISTRY) if args.name == "all" else [args.name]
    for name in names:
        F.dataset(name)                                   # an unknown name: one error before any download
    for name in names:
        for path, local, how in F.fetch(name, quiet=args.quiet):
            print(f"{name}: {path} {how}: {local}")


def register(sub):
    p = sub.add_parser("data", help="the public datasets: list them and where they are, or fetch them")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = actions.add_parser("list", help="each dataset: size, source, whether it is here, and where")
    ls.set_defaults(func=run_list)
    fe = actions.add_parser("fetch", help="download what the data folder lacks of a dataset (or all) into the "
                                          "cache, checking each file's hash")
    fe.add_argument("name", help="imdb, agnews, multi30k, or all")
    fe.add_argument("--quiet", action="store_true", help="no announcement or progress bar")
    fe.set_defaults(func=run_fetch)
