// Token trees (capability `trees`; docs/protocol.md, Trees; docs/contract.md, Trees).
//
// A round's verified tree is the pending token (node 0, the one root) and the suite's draft nodes under
// it: fed node i + 1 is draft node i, and a draft parent of -1 means the pending token. Every node runs
// as a one-token forward at position base + depth, from its parent's conv window and with its
// ancestors' KV rows at positions base..base + depth - 1: the tree attention mask (a node sees the
// context and its ancestors, never a sibling) and per-branch state from the parent. The model's chunk
// invariance (model.hpp) makes each node's row that of sequential decoding of its root path, bit for
// bit. The round then commits the winning path: its KV rows and the conv state of its last kept node
// (checkpoint), or the state before the round plus a replay of the kept tokens (replay). With
// `sampling` (capability sampled_trees) the winning path is chosen by sampled_tree_accept (sampling.hpp)
// instead of the greedy rule; verification and commit are the same.
//
// Included by main.cpp after class Engine: the Engine:: members below are declared in that class.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "json.hpp"
#include "model.hpp"
#include "sampling.hpp"

namespace sp {

// The most nodes a tree draft may hold (specproof.contract.tree.MAX_TREE_NODES).
static const int kMaxTreeNodes = 64;

// What one tree forward leaves: each fed node's logits row, conv state and KV rows (all layers and kv heads).
struct TreeForward {
    std::vector<int> depth;     // fed node -> depth (the pending token: 0)
    std::vector<float> logits;  // [nodes][vocab]
    std::vector<float> conv;    // [nodes][conv_size]
    std::vector<float> keys;    // [nodes][n_attn][n_kv][hd]
    std::vector<float> values;  // [nodes][n_attn][n_kv][hd]
};

static inline size_t tree_kv_index(const Model& m, int layer, int g, int pos) {
    const Config& c = m.cfg;
    return ((static_cast<size_t>(layer) * c.n_kv_heads + g) * c.max_context + pos) * c.head_dim;
}

// Copy node `node`'s KV rows to (to_cache) or from (!to_cache) position `pos` of the model's cache.
static inline void tree_kv_rows(Model& m, TreeForward& f, int node, int pos, bool to_cache) {
    const int nkv = m.cfg.n_kv_heads, hd = m.cfg.head_dim;
    const size_t per_node = static_cast<size_t>(m.n_attn) * nkv * hd;
    for (int l = 0; l < m.n_attn; ++l)
        for (int g = 0; g < nkv; ++g) {
            const size_t at = tree_kv_index(m, l, g, pos);
            const size_t mine = node * per_node + (static_cast<size_t>(l) * nkv + g) * hd;
            if (to_cache) {
                std::copy(&f.keys[mine], &f.keys[mine] + hd, &m.key_cache[at]);
                std::copy(&f.values[mine], &f.values[mine] + hd, &m.value_cache[at]);
            } else {
                std::copy(&m.key_cache[at], &m.key_cache[at] + hd, &f.keys[mine]);
                std::copy(&m.value_cache[at], &m.value_cache[at] + hd, &f.values[mine]);
            }
        }
}

// One forward over a tree of fed nodes (parents[i] < i; -1 only for node 0). The model's conv state
// and processed count are as they were on return; KV rows past `processed` are scratch, as after any
// rolled-back verify.
static inline TreeForward tree_forward(Model& m, const std::vector<int>& tokens, const std::vector<int>& parents) {
    const int n = static_cast<int>(tokens.size()), V = m.cfg.vocab_size;
    const int base = m.processed;
    const std::vector<float> entry = m.conv_state;
    const size_t per_node = static_cast<size_t>(m.n_attn) * m.cfg.n_kv_heads * m.cfg.head_dim;
    TreeForward f;
    f.depth.assign(static_cast<size_t>(n), 0);
    f.logits.assign(static_cast<size_t>(n) * V, 0.0f);
    f.conv.assign(static_cast<size_t>(n) * m.conv_size(), 0.0f);
    f.keys.assign(static_cast<size_t>(n) * per_node, 0.0f);
    f.values.assign(f.keys.size(), 0.0f);
    for (int i = 0; i < n; ++i) {
        const int parent = parents[i];
        f.depth[i] = parent < 0 ? 0 : f.depth[parent] + 1;
        for (int a = parent; a >= 0; a = parents[a]) tree_kv_rows(m, f, a, base + f.depth[a], true);
        if (parent < 0)
            m.conv_state = entry;
        else
            std::copy(f.conv.begin() + static_cast<long>(parent * m.conv_size()),
                      f.conv.begin() + static_cast<long>((parent + 1) * m.conv_size()), m.conv_state.begin());
        m.processed = base + f.depth[i];
        m.forward(&tokens[i], 1, &f.logits[static_cast<size_t>(i) * V]);
        std::copy(m.conv_state.begin(), m.conv_state.end(), f.conv.begin() + static_cast<long>(i * m.conv_size()));
        tree_kv_rows(m, f, i, base + f.depth[i], false);
    }
    m.conv_state = entry;
    m.processed = base;
    return f;
}

// The greedy tree rule over draft nodes (draft parents: -1 = the pending token) and the fed rows'
// argmax (row 0: the pending token, row i + 1: draft node i): a node matches when its parent matches
// and its token is the argmax at its parent; the deepest match wins (ties: the first in flattened
// order). Returns the accepted path (draft node indices, root first).
static inline std::vector<int> greedy_tree_path(const std::vector<int>& tokens, const std::vector<int>& parents,
                                                const std::vector<int>& argmax) {
    const int n = static_cast<int>(tokens.size());
    std::vector<char> matched(static_cast<size_t>(n), 0);
    std::vector<int> depth(static_cast<size_t>(n), 0);
    int best = -1, best_depth = 0;
    for (int i = 0; i < n; ++i) {
        const int p = parents[i];
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        if ((p < 0 || matched[p]) && tokens[i] == argmax[p + 1]) {
            matched[i] = 1;
            if (depth[i] > best_depth) best = i, best_depth = depth[i];
        }
    }
    std::vector<int> path;
    for (int a = best; a >= 0; a = parents[a]) path.push_back(a);
    std::reverse(path.begin(), path.end());
    return path;
}

// `generate`'s "tree": {"max_nodes": N} (capability trees): suite drafts; with `sampling` (capability
// sampled_trees) verified by recursive rejection sampling over siblings (sampled_tree_accept), the one
// tree scheme: a request naming scheme "match" is refused.
inline void Engine::parse_tree(const Json& req, bool greedy, bool suite, bool sampling) {
    tree_nodes_ = 0;
    const Json* t = greedy ? nullptr : req.get("tree");
    if (!t || t->kind == Json::Null) return;
    const Json* n = t->kind == Json::Object ? t->get("max_nodes") : nullptr;
    if (!n || !n->is_int() || n->integer < 1 || n->integer > kMaxTreeNodes)
        throw RequestError("tree needs max_nodes, an integer in 1.." + std::to_string(kMaxTreeNodes));
    if (!suite) throw RequestError("tree drafts come from the suite: a tree request needs drafts \"suite\"");
    if (const Json* s = req.get("scheme"); sampling && s && s->kind == Json::String && s->str != "rejection")
        throw RequestError("a sampled tree is verified by recursive rejection sampling: a tree request takes scheme "
                           "\"rejection\" (or none), not \"" + s->str + "\"");
    tree_nodes_ = static_cast<int>(n->integer);
    tree_node_state_ = false;
    if (const Json* ns = t->get("node_state"); ns && ns->kind == Json::Bool) tree_node_state_ = ns->boolean;
}

// Capability tree_state: each draft node's state, as restoring its checkpoint would leave the engine (the
// context and the node's root path: KV rows, conv state), whole, with its logits row. The engine's own
// state is as it was on return.
inline void Engine::send_node_states(Channel& ch, long long id, TreeForward& f, const std::vector<int>& parents) {
    const int base = m_.processed, V = m_.cfg.vocab_size;
    const std::vector<float> entry = m_.conv_state;
    for (int j = 1; j < static_cast<int>(parents.size()); ++j) {
        for (int a = j; a >= 0; a = parents[a]) tree_kv_rows(m_, f, a, base + f.depth[a], true);
        std::copy(f.conv.begin() + static_cast<long>(j * m_.conv_size()),
                  f.conv.begin() + static_cast<long>((j + 1) * m_.conv_size()), m_.conv_state.begin());
        m_.processed = base + f.depth[j] + 1;
        std::ostringstream o;
        o << "{\"type\":\"state\",\"id\":" << id << ",\"node\":" << j - 1 << ",\"processed\":" << m_.processed
          << ",\"logits\":\"" << base64(&f.logits[static_cast<size_t>(j) * V], static_cast<size_t>(V) * 4)
          << "\",\"arrays\":{";
        bool first = true;
        for (const auto& kv : m_.state_arrays()) {
            o << (first ? "" : ",") << json_quote(kv.first) << ":{\"dtype\":\"float32\",\"shape\":"
              << json_int_list(kv.second.shape) << ",\"data\":\"" << base64(kv.second.data.data(), kv.second.data.size() * 4)
              << "\"}";
            first = false;
        }
        o << "}}";
        send(ch, o.str());
    }
    m_.conv_state = entry;
    m_.processed = base;
}

// Ask the suite for a tree of at most tree_nodes_ nodes and depth k; its tokens and parents, checked.
inline void Engine::ask_tree(Channel& ch, long long id, int round, int ctx_len, int k, std::vector<int>& tokens,
                             std::vector<int>& parents) {
    std::ostringstream o;
    o << "{\"type\":\"propose\",\"id\":" << id << ",\"round\":" << round << ",\"context_length\":" << ctx_len
      << ",\"k\":" << k << ",\"max_nodes\":" << tree_nodes_ << "}";
    const Json msg = propose(ch, o.str());
    tokens = int_list(msg.get("tokens"), "draft tokens");
    parents = int_list(msg.get("parents"), "draft parents");
    const int n = static_cast<int>(tokens.size());
    if (static_cast<int>(parents.size()) != n)
        throw RequestError("a tree draft needs one parent per token: " + std::to_string(n) + " tokens, " +
                           std::to_string(parents.size()) + " parents");
    if (n > tree_nodes_)
        throw RequestError("the tree has " + std::to_string(n) + " nodes, more than max_nodes=" + std::to_string(tree_nodes_));
    std::vector<int> depth(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= m_.cfg.vocab_size) throw RequestError("a draft token is outside the vocabulary");
        if (parents[i] < -1 || parents[i] >= i)
            throw RequestError("parents[" + std::to_string(i) + "]=" + std::to_string(parents[i]) +
                               " must be -1 (the pending token) or an earlier node");
        depth[i] = parents[i] < 0 ? 1 : depth[parents[i]] + 1;
        if (depth[i] > k)
            throw RequestError("node " + std::to_string(i) + " is at depth " + std::to_string(depth[i]) +
                               ", deeper than k=" + std::to_string(k));
    }
}

// One tree round after the state message: ask, verify every node in one tree forward, accept the
// winning path, commit its state, send the round record. Returns the emitted tokens.
inline std::vector<int> Engine::tree_round(Channel& ch, long long id, int round, const std::vector<int>& ctx,
                                           int k_eff, int remaining, int eos, StatsCounter& st,
                                           const SamplingParams* smp, Rng& rng) {
    std::vector<int> draft, parents;
    if (k_eff > 0) ask_tree(ch, id, round, static_cast<int>(ctx.size()), k_eff, draft, parents);
    const int n = static_cast<int>(draft.size());
    std::vector<int> fed = {ctx.back()}, fed_parents = {-1};
    for (int i = 0; i < n; ++i) {
        fed.push_back(draft[i]);
        fed_parents.push_back(parents[i] + 1);
    }
    // the planted bug: the flattened order verified as a chain (each node after the one before it)
    std::vector<int> run_parents = fed_parents;
    if (bug("tree-as-chain") && m_.processed + n < m_.cfg.max_context)
        for (int i = 0; i <= n; ++i) run_parents[i] = i - 1;
    const int base = m_.processed;
    TreeForward f = tree_forward(m_, fed, run_parents);
    ++st.verify;
    if (tree_node_state_) send_node_states(ch, id, f, run_parents);
    const int V = m_.cfg.vocab_size;
    std::vector<int> argmax(static_cast<size_t>(n) + 1);
    for (int r = 0; r <= n; ++r) {
        const float* row = &f.logits[static_cast<size_t>(r) * V];
        argmax[r] = static_cast<int>(std::max_element(row, row + V) - row);  // first max
    }
    std::vector<int> path;  // draft node indices, root first
    std::vector<int> accepted;
    if (smp != nullptr) {  // capability sampled_trees: the sampled rule over the rows as fed (run_parents)
        std::vector<std::vector<int>> children(static_cast<size_t>(n) + 1);
        for (int i = 1; i <= n; ++i) children[static_cast<size_t>(fed_parents[i])].push_back(i);
        std::vector<std::vector<double>> p(static_cast<size_t>(n) + 1);
        for (int r = 0; r <= n; ++r) p[r] = processed_distribution(&f.logits[static_cast<size_t>(r) * V], V, *smp);
        const auto verdict = sampled_tree_accept(children, fed, p, rng, bug("tree-sampled-stale-residual"));
        for (int node : verdict.first) path.push_back(node - 1);
        for (int node : path) accepted.push_back(draft[node]);
        accepted.push_back(verdict.second);
    } else {
        path = greedy_tree_path(draft, parents, argmax);
        for (int node : path) accepted.push_back(draft[node]);
        accepted.push_back(argmax[path.empty() ? 0 : path.back() + 1]);
    }
    std::vector<int> emitted(accepted.begin(), accepted.begin() + std::min(remaining, static_cast<int>(accepted.size())));
    if (eos >= 0) {
        auto it = std::find(emitted.begin(), emitted.end(), eos);
        if (it != emitted.end()) emitted.erase(it + 1, emitted.end());
    }
    // the kept fed nodes: the pending token, then the path cut to the emitted tokens
    std::vector<int> kept = {0};
    for (int d = 0; d + 1 < static_cast<int>(emitted.size()); ++d) kept.push_back(path[d] + 1);
    const int keep = static_cast<int>(kept.size());
    if (opt_.rollback == "checkpoint") {
        for (int d = 0; d < keep; ++d) tree_kv_rows(m_, f, kept[d], base + d, true);
        const int last = kept.back();
        std::copy(f.conv.begin() + static_cast<long>(last * m_.conv_size()),
                  f.conv.begin() + static_cast<long>((last + 1) * m_.conv_size()), m_.conv_state.begin());
        m_.processed = base + keep;
    } else {
        std::vector<int> replay;
        for (int node : kept) replay.push_back(fed[node]);
        std::vector<float> logits(static_cast<size_t>(keep) * V);
        m_.forward(replay.data(), keep, logits.data());
        ++st.replay;
    }
    fed_.resize(base);
    for (int node : kept) fed_.push_back(fed[node]);
    fed_.resize(m_.processed);
    ++st.rounds;
    st.drafted += n;
    st.accepted += static_cast<int>(path.size());
    int deepest = 0;
    for (int d : f.depth) deepest = std::max(deepest, d);
    for (int p = 0; p < deepest && p < static_cast<int>(st.attempts.size()); ++p) {
        ++st.attempts[p];
        if (p < static_cast<int>(path.size())) ++st.accepts[p];
    }
    std::ostringstream o;
    o << "{\"type\":\"round\",\"id\":" << id << ",\"round\":" << round << ",\"base\":" << base
      << ",\"draft\":" << json_int_list(draft) << ",\"parents\":" << json_int_list(parents)
      << ",\"argmax\":" << json_int_list(argmax) << ",\"accepted\":" << json_int_list(accepted)
      << ",\"path\":" << json_int_list(path) << ",\"processed\":" << m_.processed << "}";
    send(ch, o.str());
    return emitted;
}

}  // namespace sp
