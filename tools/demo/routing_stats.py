#!/usr/bin/env python3
"""Routing statistics of a trace in the format of docs/trace-format.md (one JSON object per line with
problem_id, layer, token_idx, experts strongest first): expert popularity per layer and
token-to-token reuse (the share of a token's experts that the previous token of the same
problem also used, per layer). Prints markdown.

    python3 tools/demo/routing_stats.py models/demo/routing.jsonl N_EXPERTS
"""
import collections
import json
import sys


def main() -> None:
    path, n_expert = sys.argv[1], int(sys.argv[2])
    rows = [json.loads(l) for l in open(path)]
    by_seq = collections.defaultdict(list)
    for r in rows:
        by_seq[(r["problem_id"], r["layer"])].append(r)
    layers = sorted({r["layer"] for r in rows})
    k = len(rows[0]["experts"])
    print(f"{len(rows)} routing rows, {len({r['problem_id'] for r in rows})} sequences, "
          f"{len(layers)} layers, top-{k} of {n_expert}\n")
    print("| layer | most used expert (share) | least used (share) | unused experts | top-4 share | reuse from previous token |")
    print("|---|---|---|---|---|---|")
    for layer in layers:
        count = collections.Counter()
        reuse = total = 0
        for (p, l), seq in by_seq.items():
            if l != layer:
                continue
            seq.sort(key=lambda r: r["token_idx"])
            prev = None
            for r in seq:
                count.update(r["experts"])
                if prev is not None:
                    reuse += len(set(r["experts"]) & set(prev))
                    total += k
                prev = r["experts"]
        n = sum(count.values())
        ranked = [(count.get(e, 0), e) for e in range(n_expert)]
        ranked.sort(reverse=True)
        top4 = sum(c for c, _ in ranked[:4]) / n
        unused = sum(1 for c, _ in ranked if c == 0)
        print(f"| {layer} | {ranked[0][1]} ({ranked[0][0] / n:.3f}) | {ranked[-1][1]} ({ranked[-1][0] / n:.3f}) | "
              f"{unused} | {top4:.3f} | {reuse / total:.3f} |")
    print(f"\nUniform routing would give each expert {1 / n_expert:.3f}, a top-4 share of {4 / n_expert:.3f} "
          f"and a reuse of about {k / n_expert:.3f}.")


if __name__ == "__main__":
    main()
