"""Best-of-n by fork: decode the prompt once, fork it n times (O(1): the pages are
shared copy-on-write), sample a continuation on each branch with its own seed,
and keep the one with the highest mean log-probability.

    python3 best_of_n.py [MODEL.gguf] [-n 4] [--tokens 24] [--prompt TEXT]

Without a model file it uses pagekv's built-in tiny model (random weights: the
text is noise, the mechanics are real). It checks its own result: the winner's
tokens, fed to a fresh context, give bitwise the logits the branch ended with.
"""
import argparse
import math

import pagekv


def log_softmax_at(logits, token):
    m = max(logits)
    return logits[token] - m - math.log(sum(math.exp(x - m) for x in logits))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--prompt", default="Once upon a time")
    a = ap.parse_args()

    with (pagekv.Model(a.model) if a.model else pagekv.Model.builtin()) as model:
        cache = model.cache(n_ctx=256, n_seq_max=a.n + 2)
        root = cache.context()
        prompt = model.tokenize(a.prompt)
        root.decode(prompt)

        results = []
        for seed in range(a.n):
            branch = root.fork()
            score, toks = 0.0, []
            for t in branch.generate(a.tokens, temp=0.9, top_k=40, seed=seed, stop_at_eog=False):
                # generate yields t before decoding it: the logits it was drawn from are current
                score += log_softmax_at(branch.logits(), t)
                toks.append(t)
            results.append((score / len(toks), seed, toks, branch))
            print("branch %d: mean logprob %.3f  %r" % (seed, score / len(toks), model.detokenize(toks)))

        best = max(results, key=lambda r: r[0])
        print("best: branch %d" % best[1])
        print("pages: %(pages_used)d used, %(cow_pages)d copied on write" % cache.stats())

        # the check: the winner equals a replay from scratch, bit for bit
        branch = best[3]
        assert branch.tokens == prompt + best[2]  # a finished generate() decoded every token
        with cache.context() as replay:
            replay.decode(branch.tokens)
            assert branch.logits().tobytes() == replay.logits().tobytes()
        print("ok: the best branch equals a replay")


if __name__ == "__main__":
    main()
