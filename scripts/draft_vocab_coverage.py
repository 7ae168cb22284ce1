"""How much of the distilled answers a draft vocabulary covers: a token outside it is never drafted (the drafter adds
only the request's own tokens at run time), so coverage caps every head's acceptance.  Prints, per corpus group, the
shipped heads' coverage, and the coverage of the top-n tokens by frequency over all the corpora given.

    python scripts/draft_vocab_coverage.py --heads assets/s4c/smollm2-135m-instruct \\
        --corpora 'assets/corpus/*.jsonl.gz' 'assets/corpus/sharegpt/shard-*.jsonl.gz'
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path

from safetensors.torch import load_file

from specdemo.offline.corpus import answer_counts


def coverage(counts: collections.Counter, vocab: set[int]) -> float:
    return sum(v for k, v in counts.items() if k in vocab) / max(1, sum(counts.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default="assets/s4c/smollm2-135m-instruct")
    ap.add_argument("--corpora", nargs="+", required=True, help="globs; each glob is one group")
    ap.add_argument("--sizes", default="1024,2048,4096,8192,16384")
    args = ap.parse_args()
    shipped = set(load_file(str(Path(args.heads) / "model.safetensors"))["draft_vocab"].tolist())
    total: collections.Counter = collections.Counter()
    for group in args.corpora:
        counts = answer_counts([group])
        total.update(counts)
        print(f"{group}: {sum(counts.values()):,} answer tokens, {len(counts):,} distinct, "
              f"the heads' {len(shipped):,}-token vocabulary covers {coverage(counts, shipped):.3f}")
    ranked = [k for k, _ in total.most_common()]
    print(f"all: {sum(total.values()):,} answer tokens; the heads' vocabulary covers {coverage(total, shipped):.3f}")
    for n in map(int, args.sizes.split(",")):
        print(f"  the {n:,} most frequent tokens cover {coverage(total, set(ranked[:n])):.3f}")


if __name__ == "__main__":
    main()
