// Sampling for the native engine (docs/protocol.md, Sampling; docs/contract.md, Sampling): the
// processed distribution p of a logits row, a per-request generator, and the two lossless
// acceptance rules (rejection sampling against the draft's q rows, and sample-and-match).
//
// This is the engine's own arithmetic: it need not be bit-equal to numpy's, only lossless, and
// one request seed gives one output (capability `seeded`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace sp {

struct SamplingParams {
    double temperature = 1.0;
    long long top_k = 0;   // 0: off
    double top_p = 1.0;    // 1: off
    double min_p = 0.0;    // 0: off
    bool has_seed = false;
    uint64_t seed = 0;
    // temperature 0 or top_k 1: p is one-hot on the first maximum (greedy)
    bool greedy() const { return temperature == 0.0 || top_k == 1; }
};

// One request's generator: std::mt19937_64 seeded by the request's seed (or std::random_device),
// a uniform double in [0, 1) from its top 53 bits.
class Rng {
   public:
    explicit Rng(const SamplingParams& s) : gen_(s.has_seed ? s.seed : fresh()) {}
    double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

   private:
    static uint64_t fresh() {
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::mt19937_64 gen_;
};

// Token ids by value descending, the lower id first among equals (the tie rule of greedy).
inline std::vector<int> order_desc(const std::vector<double>& v) {
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
    return idx;
}

// p for one row of logits, in the contract's order: greedy (one-hot on the first maximum); else
// z = logits / temperature; top_k (by z, lower id first among equals); softmax over the kept tokens;
// top_p (keep a token while the mass before it, probability descending and lower id first, is below
// top_p); min_p (drop tokens below min_p times the largest); renormalize.
inline std::vector<double> processed_distribution(const float* row, int vocab, const SamplingParams& s) {
    std::vector<double> p(static_cast<size_t>(vocab), 0.0);
    if (s.greedy()) {
        p[static_cast<size_t>(std::max_element(row, row + vocab) - row)] = 1.0;
        return p;
    }
    std::vector<double> z(static_cast<size_t>(vocab));
    std::vector<char> keep(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) {
        z[i] = static_cast<double>(row[i]) / s.temperature;
        keep[i] = std::isfinite(z[i]) ? 1 : 0;
    }
    if (s.top_k > 0 && s.top_k < vocab) {
        std::vector<double> ranked = z;
        for (int i = 0; i < vocab; ++i)
            if (!keep[i]) ranked[i] = -INFINITY;
        const std::vector<int> order = order_desc(ranked);
        for (size_t r = static_cast<size_t>(s.top_k); r < order.size(); ++r) keep[order[r]] = 0;
    }
    double top = -INFINITY;
    for (int i = 0; i < vocab; ++i)
        if (keep[i]) top = std::max(top, z[i]);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) {
        p[i] = keep[i] ? std::exp(z[i] - top) : 0.0;
        sum += p[i];
    }
    for (double& v : p) v /= sum;
    if (s.top_p < 1.0) {
        const std::vector<int> order = order_desc(p);
        double before = 0.0;
        for (int idx : order) {
            const double mass = p[idx];
            if (before >= s.top_p) p[idx] = 0.0;
            before += mass;
        }
    }
    if (s.min_p > 0.0) {
        const double floor = s.min_p * *std::max_element(p.begin(), p.end());
        for (double& v : p)
            if (v < floor) v = 0.0;
    }
    sum = 0.0;
    for (double v : p) sum += v;
    for (double& v : p) v /= sum;
    return p;
}

// One token from `probs` (any non-negative weights with mass): inverse CDF on one uniform, never a
// token of weight 0.
inline int draw(const std::vector<double>& probs, Rng& rng) {
    std::vector<double> cdf(probs.size());
    double acc = 0.0;
    for (size_t i = 0; i < probs.size(); ++i) cdf[i] = acc += probs[i];
    const double u = rng.uniform() * acc;
    int token = static_cast<int>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    token = std::min(token, static_cast<int>(probs.size()) - 1);
    while (token > 0 && probs[static_cast<size_t>(token)] <= 0.0) --token;
    return token;
}

// The draft's proposal row i: the suite's q row when it sent one, else one-hot on the draft token.
inline double q_of(const std::vector<std::vector<double>>& q, const std::vector<int>& draft, size_t i, int token) {
    if (q.empty()) return token == draft[i] ? 1.0 : 0.0;
    return q[i][static_cast<size_t>(token)];
}

// Rejection sampling over one verify forward: (j, token): draft[:j] kept, then token. Draft token x at
// position i is kept with probability min(1, p[i][x] / q[i][x]); the first rejected one is replaced by a
// draw from the normalized residual max(0, p[i] - q[i]) (planted bug `wrong_residual`: from p[i]); after
// a full accept the bonus is a draw from p[len(draft)].
inline std::pair<int, int> rejection_accept(const std::vector<int>& draft, const std::vector<std::vector<double>>& q,
                                            const std::vector<std::vector<double>>& p, Rng& rng, bool wrong_residual) {
    for (size_t i = 0; i < draft.size(); ++i) {
        const int x = draft[i];
        const double proposal = q_of(q, draft, i, x), target = p[i][static_cast<size_t>(x)];
        if (proposal > 0.0 && rng.uniform() * proposal < target) continue;
        std::vector<double> residual(p[i].size());
        double mass = 0.0;
        for (size_t t = 0; t < residual.size(); ++t) {
            residual[t] = wrong_residual ? p[i][t] : std::max(0.0, p[i][t] - q_of(q, draft, i, static_cast<int>(t)));
            mass += residual[t];
        }
        if (mass <= 0.0) residual = p[i];  // q equals p up to rounding: the residual is p itself
        return {static_cast<int>(i), draw(residual, rng)};
    }
    return {static_cast<int>(draft.size()), draw(p[draft.size()], rng)};
}

// Sample-and-match: the target samples every position itself; a draft token is kept only when equal to
// the target's sample. (j, token): draft[:j] kept, then the target's own sample.
inline std::pair<int, int> match_accept(const std::vector<int>& draft, const std::vector<std::vector<double>>& p,
                                        Rng& rng) {
    for (size_t i = 0; i < draft.size(); ++i) {
        const int sampled = draw(p[i], rng);
        if (sampled != draft[i]) return {static_cast<int>(i), sampled};
    }
    return {static_cast<int>(draft.size()), draw(p[draft.size()], rng)};
}

// Recursive rejection sampling over a deterministic tree's siblings (capability sampled_trees;
// docs/contract.md, Sampled trees). Fed node 0 is the pending token; children[n]: node n's children in
// flattened order; tokens[n]: fed node n's token; p[n]: its processed distribution. From node 0 down, r is
// the node's p; child x (one-hot q) is kept with probability min(1, r(x)), i.e. when one uniform < r(x);
// on a rejection r <- normalize(max(r - onehot(x), 0)) (x zeroed; planted bug `stale_residual`: r left
// as it was) and the next sibling is tried. When every child is rejected (or there is none) the round's
// last token is a draw from r. Returns (the kept fed nodes below node 0, root first; the last token).
inline std::pair<std::vector<int>, int> sampled_tree_accept(const std::vector<std::vector<int>>& children,
                                                            const std::vector<int>& tokens,
                                                            const std::vector<std::vector<double>>& p, Rng& rng,
                                                            bool stale_residual) {
    std::vector<int> path;
    int node = 0;
    while (true) {
        std::vector<double> r = p[static_cast<size_t>(node)];
        int kept = -1;
        for (int child : children[static_cast<size_t>(node)]) {
            const size_t x = static_cast<size_t>(tokens[static_cast<size_t>(child)]);
            if (rng.uniform() < r[x]) {
                kept = child;
                break;
            }
            if (stale_residual) continue;
            double mass = 0.0;
            for (size_t t = 0; t < r.size(); ++t) mass += t == x ? 0.0 : r[t];
            if (mass <= 0.0) continue;  // r was one-hot on x: the rejection had probability 0, r stays the law
            r[x] = 0.0;
            for (double& v : r) v /= mass;
        }
        if (kept < 0) return {path, draw(r, rng)};
        path.push_back(kept);
        node = kept;
    }
}

}  // namespace sp
