"""A tree search over continuations, two ways:

1. beam search that branches by fork: each beam is a context; its children are
   forks (O(1), pages shared copy-on-write) that each decode one candidate token;
   the best `width` survive and the rest are closed;
2. depth-first search that backtracks by truncate: ONE context walks the whole
   tree, decoding a token to go down and truncating to come back up, so the
   cache never holds more than one path.

    python3 tree_search.py [MODEL.gguf] [--width 3] [--depth 5] [--branch 2]

It checks its own result: every leaf's score from the depth-first walk equals the
score of that path decoded from scratch in a fresh context, bit for bit.
"""
import argparse

import numpy as np

import pagekv


def log_softmax(logits):
    x = logits.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def beam_search(cache, prompt, width, depth):
    root = cache.context()
    root.decode(prompt)
    beams = [(0.0, [], root)]
    for _ in range(depth):
        children = []
        for score, path, ctx in beams:
            lp = log_softmax(ctx.logits())
            for t in np.argsort(-lp, kind="stable")[:width]:
                child = ctx.fork()
                child.decode([int(t)])
                children.append((score + lp[t], path + [int(t)], child))
            ctx.close()
        children.sort(key=lambda c: -c[0])
        for _, _, ctx in children[width:]:
            ctx.close()  # pruned: their private pages go back to the pool
        beams = children[:width]
    best = beams[0]
    for _, _, ctx in beams:
        ctx.close()
    return best[0], best[1]


def dfs(ctx, branch, depth, score, path, leaves):
    if depth == 0:
        leaves.append((score, list(path)))
        return
    lp = log_softmax(ctx.logits())
    here = len(ctx)
    for t in np.argsort(-lp, kind="stable")[:branch]:
        ctx.decode([int(t)])
        path.append(int(t))
        dfs(ctx, branch, depth - 1, score + lp[t], path, leaves)
        path.pop()
        ctx.truncate(here)  # back up: the tokens below this node are dropped
        if here:
            # truncate leaves no logits: decode the node's last token again
            last = ctx.tokens[-1]
            ctx.truncate(here - 1)
            ctx.decode([last])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--width", type=int, default=3)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--branch", type=int, default=2)
    ap.add_argument("--prompt", default="The answer is")
    a = ap.parse_args()

    with (pagekv.Model(a.model) if a.model else pagekv.Model.builtin()) as model:
        cache = model.cache(n_ctx=256, n_seq_max=2 * a.width * a.width + 2)
        prompt = model.tokenize(a.prompt)

        score, path = beam_search(cache, prompt, a.width, a.depth)
        print("beam search (fork): best %r, logprob %.3f" % (model.detokenize(path), score))

        ctx = cache.context()
        ctx.decode(prompt)
        leaves = []
        dfs(ctx, a.branch, a.depth, 0.0, [], leaves)
        assert ctx.tokens == prompt  # the walk came back to the root
        best = max(leaves)
        print("depth-first (truncate): %d leaves, best %r, logprob %.3f"
              % (len(leaves), model.detokenize(best[1]), best[0]))
        print("pages in use now: %d (one path at a time)" % cache.stats()["pages_used"])

        # the check: every leaf's score from scratch
        for s, p in leaves:
            with cache.context() as fresh:
                rows = fresh.decode_all(prompt + p)
                again = sum(log_softmax(rows[len(prompt) - 1 + i])[t] for i, t in enumerate(p))
                assert again == s, (p, again, s)
        print("ok: %d leaves scored again from scratch, bit for bit" % len(leaves))


if __name__ == "__main__":
    main()
