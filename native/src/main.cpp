// specproof-engine: a native (C++17, standard library only) speculative decoding engine for
// the specproof `trained` fixture, speaking specproof-engine/1 (JSON Lines) on stdio or TCP.
//
//   specproof-engine --weights trained.safetensors [--k 4] [--rollback checkpoint|replay]
//                    [--scheme rejection|match] [--bug NAME] [--listen PORT] [--max-context N] [--slots N]
//   specproof-engine --weights W --logits IN.json OUT.f32      (test hook: raw logits of a forward)
//   specproof-engine --weights W --bench PROMPT_FILE [--tokens N] (in-process speed figures, JSON)
//
// See native/README.md and docs/protocol.md.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "json.hpp"
#include "model.hpp"
#include "processors.hpp"
#include "sampling.hpp"

namespace sp {

static const char* kVersion = "0.1.0";
static const char* kBugs[] = {"stale-conv", "processed-off-by-one", "skip-restore-when-zero-accepted",
                              "bonus-from-wrong-row", "prefix-reuse-stale-state", "tokens-after-eos",
                              "old-kv-row", "never-reuses-prefix", "overclaims-prefix-reuse", "wrong-residual",
                              "slot-reuse-stale-state", "tree-as-chain", "penalty-counts-rejected",
                              "tree-sampled-stale-residual"};

using Clock = std::chrono::steady_clock;
static double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// --------------------------------------------------------------------------- line channel

class Channel {
   public:
    Channel(int in_fd, int out_fd) : in_(in_fd), out_(out_fd) {}
    // false at end of input
    bool read_line(std::string& line) {
        for (;;) {
            size_t nl = buf_.find('\n', scan_);
            if (nl != std::string::npos) {
                line.assign(buf_, 0, nl);
                buf_.erase(0, nl + 1);
                scan_ = 0;
                if (!line.empty() && line.back() == '\r') line.pop_back();
                return true;
            }
            scan_ = buf_.size();
            char tmp[65536];
            ssize_t n = ::read(in_, tmp, sizeof tmp);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                if (!buf_.empty()) {
                    line.swap(buf_);
                    buf_.clear();
                    scan_ = 0;
                    return true;
                }
                return false;
            }
            buf_.append(tmp, static_cast<size_t>(n));
        }
    }
    bool write_line(const std::string& line) {
        std::string s = line + "\n";
        size_t off = 0;
        while (off < s.size()) {
            ssize_t n = ::write(out_, s.data() + off, s.size() - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return false;
            off += static_cast<size_t>(n);
        }
        return true;
    }

   private:
    int in_, out_;
    std::string buf_;
    size_t scan_ = 0;
};

// --------------------------------------------------------------------------- base64

static std::string base64(const void* data, size_t n) {
    static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char* p = static_cast<const unsigned char*>(data);
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
        out += tbl[v >> 18];
        out += tbl[(v >> 12) & 63];
        out += tbl[(v >> 6) & 63];
        out += tbl[v & 63];
    }
    if (n - i == 1) {
        unsigned v = p[i] << 16;
        out += tbl[v >> 18];
        out += tbl[(v >> 12) & 63];
        out += "==";
    } else if (n - i == 2) {
        unsigned v = (p[i] << 16) | (p[i + 1] << 8);
        out += tbl[v >> 18];
        out += tbl[(v >> 12) & 63];
        out += tbl[(v >> 6) & 63];
        out += '=';
    }
    return out;
}

// --------------------------------------------------------------------------- engine

struct RequestError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct PeerGone : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Options {
    std::string weights;
    int k = 4;
    std::string rollback = "checkpoint";
    std::string scheme = "rejection";  // the sampled requests' default acceptance rule (a request may name one)
    std::set<std::string> bugs;
    int listen_port = -1;
    int max_context = 0;
    int ngram_max = 3;
    int max_snapshots = 64;
    int slots = 4;  // the batch slot pool (capability batched): requests holding state at once, and rows per step
};

struct StatsCounter {
    int rounds = 0, emitted = 0, prefill = 0, verify = 0, replay = 0, drafted = 0, accepted = 0;
    int reused = 0;  // prompt tokens served from the session's caches (final.stats.prefix_reused)
    std::vector<int> attempts, accepts;
};

class Engine {
   public:
    Engine(Model& model, const Options& opt) : m_(model), opt_(opt) {
        if (opt.max_context > 0) {
            if (opt.max_context > m_.cfg.max_context)
                throw ModelError("--max-context " + std::to_string(opt.max_context) + " exceeds the model's " +
                                 std::to_string(m_.cfg.max_context));
            max_context_ = opt.max_context;
        } else {
            max_context_ = m_.cfg.max_context;
        }
        if (opt.slots < 1) throw ModelError("--slots must be >= 1");
        batch_reset();
    }

    bool bug(const char* name) const { return opt_.bugs.count(name) > 0; }

    std::string hello() const {
        std::ostringstream o;
        o << "{\"type\":\"hello\",\"protocol\":\"specproof-engine/1\",\"engine\":{\"name\":\"specproof-native\",\"version\":\""
          << kVersion << "\"},\"vocab_size\":" << m_.cfg.vocab_size << ",\"max_context\":" << max_context_
          << ",\"k\":" << opt_.k << ",\"rollback\":\"" << opt_.rollback
          << "\",\"capabilities\":[\"greedy\",\"suite_drafts\",\"state\",\"sessions\",\"state_delta\",\"state_digest\","
             "\"sampling\",\"seeded\",\"batched\",\"trees\",\"tree_state\",\"sampled_trees\",\"penalties\",\"logit_bias\",\"bad_words\","
             "\"min_tokens\",\"stop_sequences\",\"logprobs\",\"processor_state\"],\"sampling_schemes\":[\""
          << opt_.scheme << "\",\"" << (opt_.scheme == "match" ? "rejection" : "match") << "\"]"
          << ",\"batch\":{\"max_batch\":" << opt_.slots << ",\"slots\":" << opt_.slots
          << ",\"continuous_arrivals\":true,\"preemption\":[\"snapshot\",\"recompute\"],\"schedulable\":true,"
             "\"batch_invariant_seeding\":true}";
        if (!m_.model_spec.empty()) {
            // the oracle must have the same capacity: trained -> trained:max_context=N
            std::string spec = m_.model_spec;
            if (max_context_ != m_.cfg.max_context && spec.find(':') == std::string::npos)
                spec += ":max_context=" + std::to_string(max_context_);
            o << ",\"model\":" << json_quote(spec);
        }
        o << ",\"atol\":0.0005,\"tie_tolerance\":0.001";
        if (!opt_.bugs.empty()) {
            std::string names = "planted bugs:";
            for (const auto& b : opt_.bugs) names += " " + b;
            o << ",\"notes\":" << json_quote(names);
        }
        o << "}";
        return o.str();
    }

    void reset() {
        m_.reset();
        fed_.clear();
        snaps_.clear();
        batch_reset();
    }

    // One request: generate (spec) or greedy. Writes round/state/propose/final messages.
    void run(Channel& ch, const Json& req, bool greedy) {
        const long long id = req.get("id")->integer;
        std::vector<int> prompt = int_list(req.get("prompt"), "prompt");
        const Json* mnt = req.get("max_new_tokens");
        const int max_new = static_cast<int>(mnt->integer);
        int eos = -1;
        if (const Json* e = req.get("eos_token_id"); e && e->kind == Json::Number) eos = static_cast<int>(e->integer);
        bool suite = false, state = false;
        bool sampling = false;
        SamplingParams smp;
        std::string scheme = opt_.scheme;
        bool decoding = false, want_logprobs = false, want_pstate = false;  // docs/protocol.md, Decode state
        DecodeParams dp;
        delta_ = false;
        digest_n_ = 0;
        sent_rows_ = -1;  // the first state message of a request is whole
        if (!greedy) {
            if (const Json* d = req.get("drafts")) suite = d->str == "suite";
            if (const Json* s = req.get("state")) state = s->boolean;
            if (const Json* s = req.get("state_delta")) delta_ = s->kind == Json::Bool && s->boolean;
            if (const Json* d = req.get("state_digest"); d && d->kind == Json::Object) {
                const Json* seed = d->get("seed");
                const Json* n = d->get("projections");
                if (!seed || !seed->is_int() || seed->integer < 0 || !n || !n->is_int() || n->integer < 1 ||
                    n->integer > 16)
                    throw RequestError("state_digest needs an integer seed >= 0 and projections in 1..16");
                digest_seed_ = static_cast<uint64_t>(seed->integer);
                digest_n_ = static_cast<int>(n->integer);
            }
            if (const Json* s = req.get("sampling"); s && s->kind != Json::Null) {
                smp = parse_sampling(*s);
                sampling = true;
            }
            if (const Json* s = req.get("scheme"); s && s->kind != Json::Null) {
                if (s->kind != Json::String || (s->str != "rejection" && s->str != "match"))
                    throw RequestError("scheme must be \"rejection\" or \"match\"");
                scheme = s->str;
            }
            if (const Json* d = req.get("decode"); d && d->kind != Json::Null) {
                try {
                    dp = parse_decode(*d, m_.cfg.vocab_size);
                } catch (const DecodeError& e) {
                    throw RequestError(e.what());
                }
                decoding = true;
            }
            if (const Json* l = req.get("logprobs")) want_logprobs = l->kind == Json::Bool && l->boolean;
            if (const Json* ps = req.get("processor_state")) want_pstate = ps->kind == Json::Bool && ps->boolean;
        }
        parse_tree(req, greedy, suite, sampling);  // capability trees (tree.hpp)
        if (!sampling) smp.has_seed = true;  // a greedy request draws nothing: no entropy is read for it
        Rng rng(smp);
        if (prompt.empty()) throw RequestError("the prompt is empty: a generation needs at least one token (the pending one)");
        for (size_t i = 0; i < prompt.size(); ++i)
            if (prompt[i] < 0 || prompt[i] >= m_.cfg.vocab_size)
                throw RequestError("prompt[" + std::to_string(i) + "]=" + std::to_string(prompt[i]) + " is outside [0, " +
                                   std::to_string(m_.cfg.vocab_size) + ")");
        if (eos >= m_.cfg.vocab_size) throw RequestError("eos_token_id is outside the vocabulary");
        if (static_cast<int>(prompt.size()) > max_context_)
            throw RequestError("the prompt has " + std::to_string(prompt.size()) + " tokens, more than max_context=" +
                               std::to_string(max_context_));
        RequestProcessors procs;
        if (decoding) procs = RequestProcessors(dp, prompt, eos, m_.cfg.vocab_size);
        std::vector<double> logprobs;
        const auto t0 = Clock::now();
        io_us_ = 0;
        StatsCounter st;
        st.attempts.assign(opt_.k, 0);
        st.accepts.assign(opt_.k, 0);
        begin(prompt, st);
        const double prefill_us = us_since(t0);
        std::vector<int> ctx = prompt, out;
        std::string stop = "max_new_tokens";
        const int k = greedy ? 0 : opt_.k;
        int round = 0;
        std::vector<float> logits, ck, before;
        while (static_cast<int>(out.size()) < max_new) {
            const int room = max_context_ - m_.processed;
            if (room < 1) {
                stop = "context_full";
                break;
            }
            const int remaining = max_new - static_cast<int>(out.size());
            const int k_eff = std::max(0, std::min({k, remaining - 1, room - 1}));
            if (state) send_state(ch, id);
            if (tree_nodes_ > 0) {  // a tree round (tree.hpp)
                const std::vector<int> emitted = tree_round(ch, id, round++, ctx, k_eff, remaining, eos, st,
                                                               sampling ? &smp : nullptr, rng);
                ctx.insert(ctx.end(), emitted.begin(), emitted.end());
                out.insert(out.end(), emitted.begin(), emitted.end());
                if (eos >= 0 && emitted.back() == eos) {
                    stop = "eos";
                    break;
                }
                continue;
            }
            std::vector<int> draft;
            std::vector<std::vector<double>> qrows;  // the suite's q rows (empty: one-hot)
            if (k_eff > 0)
                draft = suite ? ask_draft(ch, id, round, static_cast<int>(ctx.size()), k_eff, &qrows) : ngram(ctx, k_eff);
            std::vector<int> fed = {ctx.back()};
            fed.insert(fed.end(), draft.begin(), draft.end());
            const int q = static_cast<int>(fed.size());
            const int base = m_.processed;
            const bool checkpoint = opt_.rollback == "checkpoint";
            if (!checkpoint) before = m_.conv_state;
            logits.resize(static_cast<size_t>(q) * m_.cfg.vocab_size);
            m_.forward(fed.data(), q, logits.data(), checkpoint ? &ck : nullptr);
            ++st.verify;
            if (decoding) process_rows(procs, logits, draft, q);
            std::vector<int> argmax(q);
            for (int r = 0; r < q; ++r) {
                const float* row = &logits[static_cast<size_t>(r) * m_.cfg.vocab_size];
                argmax[r] = static_cast<int>(std::max_element(row, row + m_.cfg.vocab_size) - row);  // first max
            }
            int j = 0;
            std::vector<int> accepted;
            if (sampling) {
                // p for every verify row, then the request's acceptance rule with its own generator
                std::vector<std::vector<double>> p(static_cast<size_t>(q));
                for (int r = 0; r < q; ++r)
                    p[r] = processed_distribution(&logits[static_cast<size_t>(r) * m_.cfg.vocab_size], m_.cfg.vocab_size, smp);
                const std::pair<int, int> verdict = scheme == "match" ? match_accept(draft, p, rng)
                                                                      : rejection_accept(draft, qrows, p, rng, bug("wrong-residual"));
                j = verdict.first;
                accepted.assign(draft.begin(), draft.begin() + j);
                accepted.push_back(verdict.second);
            } else {
                while (j < static_cast<int>(draft.size()) && draft[j] == argmax[j]) ++j;
                int bonus_row = j;
                if (bug("bonus-from-wrong-row") && j + 1 < q) bonus_row = j + 1;
                accepted.assign(draft.begin(), draft.begin() + j);
                accepted.push_back(argmax[bonus_row]);
            }
            std::vector<int> emitted(accepted.begin(), accepted.begin() + std::min(remaining, static_cast<int>(accepted.size())));
            if (eos >= 0 && !bug("tokens-after-eos")) {
                auto it = std::find(emitted.begin(), emitted.end(), eos);
                if (it != emitted.end()) emitted.erase(it + 1, emitted.end());
            }
            const std::string decode_stop = decoding ? procs.cut(emitted) : "";
            if (decoding) procs.commit(emitted, std::vector<int>(draft.begin() + j, draft.end()), bug("penalty-counts-rejected"));
            if (want_logprobs)
                for (size_t r = 0; r < emitted.size() && static_cast<int>(r) < q; ++r)
                    logprobs.push_back(RequestProcessors::logprob(&logits[r * m_.cfg.vocab_size], m_.cfg.vocab_size, emitted[r]));
            const int keep = std::max(1, std::min(static_cast<int>(emitted.size()), q));
            if (keep < q) rollback(fed, base, keep, j, checkpoint, ck, before, st);
            if (bug("processed-off-by-one") && keep < q) m_.processed -= 1;
            fed_.resize(base);
            fed_.insert(fed_.end(), fed.begin(), fed.begin() + keep);
            fed_.resize(m_.processed);
            ++st.rounds;
            st.drafted += static_cast<int>(draft.size());
            st.accepted += j;
            for (int p = 0; p < static_cast<int>(draft.size()); ++p) {
                ++st.attempts[p];
                if (p < j) ++st.accepts[p];
            }
            if (!greedy) {
                std::ostringstream o;
                o << "{\"type\":\"round\",\"id\":" << id << ",\"round\":" << round << ",\"base\":" << base
                  << ",\"draft\":" << json_int_list(draft) << ",\"argmax\":" << json_int_list(argmax)
                  << ",\"accepted\":" << json_int_list(accepted) << ",\"processed\":" << m_.processed;
                if (decoding && want_pstate) o << ",\"processor\":" << procs.state_json();
                o << "}";
                send(ch, o.str());
            }
            ctx.insert(ctx.end(), emitted.begin(), emitted.end());
            out.insert(out.end(), emitted.begin(), emitted.end());
            ++round;
            if (!decode_stop.empty()) {
                stop = decode_stop;
                break;
            }
            if (eos >= 0 && std::find(emitted.begin(), emitted.end(), eos) != emitted.end()) {
                stop = "eos";
                break;
            }
        }
        if (static_cast<int>(out.size()) > max_new && !bug("tokens-after-eos")) out.resize(max_new);
        if (logprobs.size() > out.size()) logprobs.resize(out.size());
        if (static_cast<int>(fed_.size()) == m_.processed) keep_snapshot();
        if (state) send_state(ch, id);
        st.emitted = static_cast<int>(out.size());
        std::ostringstream o;
        o << "{\"type\":\"final\",\"id\":" << id << ",\"tokens\":" << json_int_list(out) << ",\"stop_reason\":\"" << stop
          << "\",\"processed\":" << m_.processed;
        if (!greedy)
            o << ",\"stats\":{\"rounds\":" << st.rounds << ",\"emitted\":" << st.emitted
              << ",\"prefill_forwards\":" << st.prefill << ",\"verify_forwards\":" << st.verify
              << ",\"replay_forwards\":" << st.replay << ",\"drafted\":" << st.drafted << ",\"accepted\":" << st.accepted
              << ",\"position_attempts\":" << json_int_list(st.attempts)
              << ",\"position_accepts\":" << json_int_list(st.accepts) << ",\"prefix_reused\":" << st.reused
              << "}";
        if (want_logprobs) o << ",\"logprobs\":" << json_number_list(logprobs);
        o << ",\"elapsed_us\":" << static_cast<long long>(us_since(t0) - io_us_)
          << ",\"prefill_us\":" << static_cast<long long>(prefill_us) << "}";
        io_us_ = 0;
        send(ch, o.str());
    }

    // ---- batches (capability batched; docs/protocol.md, Batches)
    //
    // A pool of slots, each with its own KV cache, conv state and processed count, handed out through a
    // free list (the most recently freed first). A step admits waiting requests into free slots (prefill,
    // or a snapshot swapped back in), asks for every row's draft, then verifies each row in its own slot:
    // the slot's memory is swapped into the model (O(1): vector swaps), the round runs as a single
    // request's round does, and it is swapped out again. The forward is batch-invariant (README), so a
    // row run by itself gives the bits a padded batched forward would.

    void add_request(const Json& req) {
        const Json* nv = req.get("request");
        if (!nv || nv->kind != Json::String || nv->str.empty()) throw RequestError("add_request needs a non-empty string 'request'");
        const std::string& name = nv->str;
        if (breqs_.count(name)) throw RequestError("add_request: request '" + name + "' is already in the engine");
        BatchReq r;
        r.name = name;
        r.ctx = int_list(req.get("prompt"), "prompt");
        if (r.ctx.empty()) throw RequestError("the prompt is empty: a request needs at least one token (the pending one)");
        for (size_t i = 0; i < r.ctx.size(); ++i)
            if (r.ctx[i] < 0 || r.ctx[i] >= m_.cfg.vocab_size)
                throw RequestError("prompt[" + std::to_string(i) + "]=" + std::to_string(r.ctx[i]) + " is outside [0, " +
                                   std::to_string(m_.cfg.vocab_size) + ")");
        if (static_cast<int>(r.ctx.size()) > max_context_)
            throw RequestError("the prompt has " + std::to_string(r.ctx.size()) + " tokens, more than max_context=" +
                               std::to_string(max_context_));
        const Json* mnt = req.get("max_new_tokens");
        if (!mnt || !mnt->is_int() || mnt->integer < 0) throw RequestError("max_new_tokens must be an integer >= 0");
        r.max_new = static_cast<int>(mnt->integer);
        if (const Json* e = req.get("eos_token_id"); e && e->kind != Json::Null) {
            if (!e->is_int() || e->integer < 0 || e->integer >= m_.cfg.vocab_size)
                throw RequestError("eos_token_id is outside the vocabulary");
            r.eos = static_cast<int>(e->integer);
        }
        if (const Json* d = req.get("drafts")) r.suite = d->kind == Json::String && d->str == "suite";
        r.scheme = opt_.scheme;
        if (const Json* sv = req.get("sampling"); sv && sv->kind != Json::Null) {
            r.smp = parse_sampling(*sv);
            r.sampling = true;
        }
        if (const Json* sv = req.get("scheme"); sv && sv->kind != Json::Null) {
            if (sv->kind != Json::String || (sv->str != "rejection" && sv->str != "match"))
                throw RequestError("scheme must be \"rejection\" or \"match\"");
            r.scheme = sv->str;
        }
        if (!r.sampling) r.smp.has_seed = true;  // a greedy request draws nothing
        r.rng = std::make_unique<Rng>(r.smp);
        border_.push_back(name);
        breqs_.emplace(name, std::move(r));
    }

    bool step_started() const { return step_started_; }

    void step(Channel& ch, long long id, const Json& req) {
        step_started_ = false;
        std::vector<std::string> wanted;
        if (const Json* only = req.get("only"); only && only->kind != Json::Null) {
            if (only->kind != Json::Array) throw RequestError("step.only must be a list of request ids");
            std::set<std::string> names;
            for (const Json& n : only->items) {
                if (n.kind != Json::String) throw RequestError("step.only must be a list of request ids (strings)");
                if (!breqs_.count(n.str)) throw RequestError("step.only names '" + n.str + "', which is not a request in the engine");
                names.insert(n.str);
            }
            for (const auto& n : border_)
                if (names.count(n)) wanted.push_back(n);
        } else {
            wanted = border_;
        }
        step_started_ = true;  // from here on a failure leaves requests half-advanced
        std::vector<std::string> outs;
        for (const auto& name : wanted) {
            BatchReq& r = breqs_.at(name);
            if (r.phase == Phase::Running || free_.empty()) continue;
            if (r.phase == Phase::Queued && r.max_new == 0) {
                outs.push_back(finish(name, "max_new_tokens", "null", {}, -1));
                continue;
            }
            admit(r);
        }
        std::vector<BatchReq*> batch;
        for (const auto& name : wanted) {
            auto it = breqs_.find(name);
            if (it != breqs_.end() && it->second.phase == Phase::Running && static_cast<int>(batch.size()) < opt_.slots)
                batch.push_back(&it->second);
        }
        // every row's draft first: one verify step takes them all
        std::vector<std::vector<int>> drafts(batch.size());
        std::vector<std::vector<std::vector<double>>> qrows(batch.size());
        std::vector<bool> full(batch.size(), false);
        for (size_t b = 0; b < batch.size(); ++b) {
            BatchReq& r = *batch[b];
            const int room = max_context_ - slots_[r.slot].processed;
            if (room < 1) {
                full[b] = true;
                continue;
            }
            const int remaining = r.max_new - static_cast<int>(r.out.size());
            const int k_eff = std::max(0, std::min({opt_.k, remaining - 1, room - 1}));
            if (k_eff > 0)
                drafts[b] = r.suite ? ask_draft(ch, id, r.round, static_cast<int>(r.ctx.size()), k_eff, &qrows[b], &r.name)
                                    : ngram(r.ctx, k_eff);
        }
        for (size_t b = 0; b < batch.size(); ++b) {
            BatchReq& r = *batch[b];
            const std::string name = r.name;
            if (full[b]) {
                outs.push_back(finish(name, "context_full", "null", {}, r.slot));
                continue;
            }
            outs.push_back(verify_row(r, drafts[b], qrows[b]));
        }
        std::ostringstream o;
        o << "{\"type\":\"stepped\",\"id\":" << id << ",\"outputs\":[";
        for (size_t i = 0; i < outs.size(); ++i) o << (i ? "," : "") << outs[i];
        o << "]}";
        send(ch, o.str());
    }

    void abort(Channel& ch, long long id, const Json& req) {
        const std::string name = request_name(req, "abort");
        const std::string out = finish(name, "error", "null", {}, -1);
        send(ch, "{\"type\":\"stepped\",\"id\":" + std::to_string(id) + ",\"outputs\":[" + out + "]}");
    }

    void preempt(const Json& req) {
        const std::string name = request_name(req, "preempt");
        const Json* mode = req.get("mode");
        if (!mode || mode->kind != Json::String || (mode->str != "snapshot" && mode->str != "recompute"))
            throw RequestError("preempt.mode must be \"snapshot\" or \"recompute\"");
        BatchReq& r = breqs_.at(name);
        if (r.phase != Phase::Running)
            throw RequestError("preempt: request '" + name + "' is not running (it holds no slot): nothing to preempt");
        if (mode->str == "snapshot") {
            r.saved = slots_[r.slot];
            r.swapped = true;
        }
        release(r.slot);
        r.slot = -1;
        r.phase = Phase::Preempted;
    }

    void batch_reset() {
        breqs_.clear();
        border_.clear();
        free_.clear();
        for (int i = opt_.slots - 1; i >= 0; --i) free_.push_back(i);
        if (slots_.empty()) {
            slots_.resize(static_cast<size_t>(opt_.slots));
            for (Slot& sl : slots_) {
                sl.key.assign(m_.key_cache.size(), 0.0f);
                sl.value.assign(m_.value_cache.size(), 0.0f);
                sl.conv.assign(m_.conv_state.size(), 0.0f);
            }
        }
    }

    // ---- in-process use (bench)
    Model& model() { return m_; }
    int max_context() const { return max_context_; }
    std::vector<int> ngram(const std::vector<int>& ctx, int k) const {
        const int size = static_cast<int>(ctx.size());
        for (int n = std::min(opt_.ngram_max, size); n >= 1; --n) {
            for (int s = size - n - 1; s >= 0; --s) {
                if (std::equal(ctx.begin() + s, ctx.begin() + s + n, ctx.end() - n)) {
                    const int start = s + n, end = std::min(size, start + k);
                    return std::vector<int>(ctx.begin() + start, ctx.begin() + end);
                }
            }
        }
        return {};
    }

   private:
    Model& m_;
    Options opt_;
    int max_context_;
    bool delta_ = false;                        // this request asked for state_delta
    int digest_n_ = 0;                          // state_digest: projections per slice (0: no digests)
    uint64_t digest_seed_ = 0;                  // state_digest: the signs' seed (the client's, per request)
    int sent_rows_ = -1;                        // KV rows the client holds from this request (-1: none)
    std::vector<int> fed_;                      // the tokens whose KV / conv state the model holds
    std::map<int, std::vector<float>> snaps_;   // processed -> conv_state kept for prefix reuse
    double io_us_ = 0;                          // time spent waiting for the client inside a request

    // ---- the batch slot pool
    struct Slot {
        int processed = 0;
        std::vector<float> key, value, conv;
    };
    enum class Phase { Queued, Running, Preempted };
    struct BatchReq {
        std::string name;
        std::vector<int> ctx, out;
        int max_new = 0, eos = -1, round = 0, slot = -1;
        bool suite = false, sampling = false, swapped = false;
        SamplingParams smp;
        std::string scheme;
        std::unique_ptr<Rng> rng;
        Phase phase = Phase::Queued;
        Slot saved;  // a snapshot preemption's slot memory
    };
    std::vector<Slot> slots_;
    std::vector<int> free_;  // free slots; the back is handed out next (the most recently freed)
    std::map<std::string, BatchReq> breqs_;
    std::vector<std::string> border_;  // arrival order: admission and row order follow it
    bool step_started_ = false;        // the current step got past its checks

    // The slot's memory in the model for the lifetime of the guard (and back, whatever happens).
    struct SlotIn {
        Model& m;
        Slot& s;
        SlotIn(Model& model, Slot& slot) : m(model), s(slot) { swap(); }
        ~SlotIn() { swap(); }
        void swap() {
            std::swap(m.processed, s.processed);
            m.key_cache.swap(s.key);
            m.value_cache.swap(s.value);
            m.conv_state.swap(s.conv);
        }
    };

    std::string request_name(const Json& req, const char* what) const {
        const Json* nv = req.get("request");
        if (!nv || nv->kind != Json::String || nv->str.empty())
            throw RequestError(std::string(what) + " needs a non-empty string 'request'");
        if (!breqs_.count(nv->str))
            throw RequestError(std::string(what) + ": no request '" + nv->str + "' in the engine");
        return nv->str;
    }

    int acquire() {
        const int idx = free_.back();
        free_.pop_back();
        Slot& sl = slots_[idx];
        sl.processed = 0;
        // a fresh request starts from zero recurrent state; the planted bug hands it the last tenant's
        if (!bug("slot-reuse-stale-state")) std::fill(sl.conv.begin(), sl.conv.end(), 0.0f);
        return idx;
    }

    void release(int idx) {
        if (idx >= 0) free_.push_back(idx);
    }

    // A free slot for `r`: its snapshot swapped back in, else its context but the pending token prefilled.
    void admit(BatchReq& r) {
        if (r.swapped) {
            r.slot = free_.back();
            free_.pop_back();
            std::swap(slots_[r.slot], r.saved);
            r.saved = Slot();
            r.swapped = false;
        } else {
            r.slot = acquire();
            const int n = static_cast<int>(r.ctx.size()) - 1;
            if (n > 0) {
                SlotIn in(m_, slots_[r.slot]);
                std::vector<float> logits(static_cast<size_t>(n) * m_.cfg.vocab_size);
                m_.forward(r.ctx.data(), n, logits.data());
            }
        }
        r.phase = Phase::Running;
    }

    // Remove request `name` (taken by value: the request's own name is erased here), free its slot and return its output entry.
    std::string finish(const std::string name, const char* stop, const std::string& round, const std::vector<int>& emitted,
                       int slot) {
        BatchReq& r = breqs_.at(name);
        std::ostringstream o;
        o << "{\"request\":" << json_quote(name) << ",\"round\":" << round << ",\"tokens\":" << json_int_list(emitted)
          << ",\"finished\":{\"tokens\":" << json_int_list(r.out) << ",\"stop_reason\":\"" << stop << "\"}";
        if (slot >= 0) o << ",\"slot\":" << slot;
        o << "}";
        release(r.slot);
        border_.erase(std::find(border_.begin(), border_.end(), name));
        breqs_.erase(name);
        return o.str();
    }

    // One request's verify round in its own slot (the single-request round's rules); its output entry.
    std::string verify_row(BatchReq& r, const std::vector<int>& draft, const std::vector<std::vector<double>>& qrows) {
        const int slot = r.slot;
        const int remaining = r.max_new - static_cast<int>(r.out.size());
        std::vector<int> fed = {r.ctx.back()};
        fed.insert(fed.end(), draft.begin(), draft.end());
        const int q = static_cast<int>(fed.size());
        const bool checkpoint = opt_.rollback == "checkpoint";
        std::vector<int> argmax(q), accepted, emitted;
        int base = 0, processed = 0, j = 0;
        {
            SlotIn in(m_, slots_[slot]);
            base = m_.processed;
            std::vector<float> logits(static_cast<size_t>(q) * m_.cfg.vocab_size), ck, before;
            if (!checkpoint) before = m_.conv_state;
            m_.forward(fed.data(), q, logits.data(), checkpoint ? &ck : nullptr);
            for (int row = 0; row < q; ++row) {
                const float* x = &logits[static_cast<size_t>(row) * m_.cfg.vocab_size];
                argmax[row] = static_cast<int>(std::max_element(x, x + m_.cfg.vocab_size) - x);
            }
            if (r.sampling) {
                std::vector<std::vector<double>> p(static_cast<size_t>(q));
                for (int row = 0; row < q; ++row)
                    p[row] = processed_distribution(&logits[static_cast<size_t>(row) * m_.cfg.vocab_size], m_.cfg.vocab_size,
                                                    r.smp);
                const std::pair<int, int> verdict = r.scheme == "match" ? match_accept(draft, p, *r.rng)
                                                                        : rejection_accept(draft, qrows, p, *r.rng, bug("wrong-residual"));
                j = verdict.first;
                accepted.assign(draft.begin(), draft.begin() + j);
                accepted.push_back(verdict.second);
            } else {
                while (j < static_cast<int>(draft.size()) && draft[j] == argmax[j]) ++j;
                accepted.assign(draft.begin(), draft.begin() + j);
                accepted.push_back(argmax[j]);
            }
            emitted.assign(accepted.begin(), accepted.begin() + std::min(remaining, static_cast<int>(accepted.size())));
            if (r.eos >= 0) {
                auto it = std::find(emitted.begin(), emitted.end(), r.eos);
                if (it != emitted.end()) emitted.erase(it + 1, emitted.end());
            }
            const int keep = std::max(1, std::min(static_cast<int>(emitted.size()), q));
            StatsCounter st;
            if (keep < q) rollback(fed, base, keep, j, checkpoint, ck, before, st);
            processed = m_.processed;
        }
        std::ostringstream rec;
        rec << "{\"round\":" << r.round << ",\"base\":" << base << ",\"draft\":" << json_int_list(draft)
            << ",\"argmax\":" << json_int_list(argmax) << ",\"accepted\":" << json_int_list(accepted)
            << ",\"processed\":" << processed << "}";
        ++r.round;
        r.ctx.insert(r.ctx.end(), emitted.begin(), emitted.end());
        r.out.insert(r.out.end(), emitted.begin(), emitted.end());
        if (r.eos >= 0 && std::find(emitted.begin(), emitted.end(), r.eos) != emitted.end())
            return finish(r.name, "eos", rec.str(), emitted, slot);
        if (static_cast<int>(r.out.size()) >= r.max_new) return finish(r.name, "max_new_tokens", rec.str(), emitted, slot);
        std::ostringstream o;
        o << "{\"request\":" << json_quote(r.name) << ",\"round\":" << rec.str() << ",\"tokens\":" << json_int_list(emitted)
          << ",\"finished\":null,\"slot\":" << slot << "}";
        return o.str();
    }

    // A generate's `sampling` object (docs/protocol.md, Sampling): temperature required, the rest optional.
    static SamplingParams parse_sampling(const Json& s) {
        if (s.kind != Json::Object) throw RequestError("sampling must be an object");
        SamplingParams out;
        const Json* t = s.get("temperature");
        if (!t || t->kind != Json::Number || !(t->number >= 0.0 && t->number <= 1e6))
            throw RequestError("sampling.temperature must be a number in [0, 1e6]");
        out.temperature = t->number;
        if (const Json* v = s.get("top_k")) {
            if (!v->is_int() || v->integer < 0) throw RequestError("sampling.top_k must be an integer >= 0");
            out.top_k = v->integer;
        }
        if (const Json* v = s.get("top_p")) {
            if (v->kind != Json::Number || !(v->number > 0.0 && v->number <= 1.0))
                throw RequestError("sampling.top_p must be a number in (0, 1]");
            out.top_p = v->number;
        }
        if (const Json* v = s.get("min_p")) {
            if (v->kind != Json::Number || !(v->number >= 0.0 && v->number < 1.0))
                throw RequestError("sampling.min_p must be a number in [0, 1)");
            out.min_p = v->number;
        }
        if (const Json* v = s.get("seed"); v && v->kind != Json::Null) {
            if (!v->is_int() || v->integer < 0) throw RequestError("sampling.seed must be an integer in [0, 2^63) or null");
            out.has_seed = true;
            out.seed = static_cast<uint64_t>(v->integer);
        }
        for (const auto& kv : s.fields)
            if (kv.first != "temperature" && kv.first != "top_k" && kv.first != "top_p" && kv.first != "min_p" &&
                kv.first != "seed")
                throw RequestError("sampling has an unknown field '" + kv.first + "'");
        return out;
    }

    // A draft message's `q` rows, dense (docs/protocol.md, Sampling): one row per draft token of
    // [token, probability] pairs, each probability in (0, 1], no token twice, summing to 1 within 1e-6,
    // the draft token given mass. Absent or null: `out` stays empty (one-hot rows).
    void parse_q(const Json* qv, const std::vector<int>& draft, std::vector<std::vector<double>>* out) const {
        out->clear();
        if (!qv || qv->kind == Json::Null) return;
        const int vocab = m_.cfg.vocab_size;
        if (qv->kind != Json::Array || qv->items.size() != draft.size())
            throw RequestError("draft q must hold one row per draft token");
        out->assign(draft.size(), std::vector<double>(static_cast<size_t>(vocab), 0.0));
        for (size_t i = 0; i < draft.size(); ++i) {
            const Json& row = qv->items[i];
            const std::string where = "draft q[" + std::to_string(i) + "]";
            if (row.kind != Json::Array || row.items.empty() || row.items.size() > static_cast<size_t>(vocab))
                throw RequestError(where + " must be 1..vocab_size [token, probability] pairs");
            double sum = 0.0;
            for (const Json& pair : row.items) {
                if (pair.kind != Json::Array || pair.items.size() != 2 || !pair.items[0].is_int() ||
                    pair.items[1].kind != Json::Number)
                    throw RequestError(where + " must hold [token, probability] pairs");
                const long long tok = pair.items[0].integer;
                const double prob = pair.items[1].number;
                if (tok < 0 || tok >= vocab) throw RequestError(where + " names a token outside the vocabulary");
                if (!(prob > 0.0 && prob <= 1.0)) throw RequestError(where + " has a probability outside (0, 1]");
                double& slot = (*out)[i][static_cast<size_t>(tok)];
                if (slot != 0.0) throw RequestError(where + " names token " + std::to_string(tok) + " twice");
                slot = prob;
                sum += prob;
            }
            if (std::fabs(sum - 1.0) > 1e-6) throw RequestError(where + " does not sum to 1");
            if ((*out)[i][static_cast<size_t>(draft[i])] <= 0.0)
                throw RequestError(where + " gives the draft token no mass");
        }
    }

    // Each verify row processed with the state advanced through the draft before it (processors.hpp).
    void process_rows(const RequestProcessors& procs, std::vector<float>& logits, const std::vector<int>& draft, int q) {
        const size_t vocab = static_cast<size_t>(m_.cfg.vocab_size);
        try {
            for (int r = 0; r < q; ++r)
                procs.process(&logits[static_cast<size_t>(r) * vocab], std::vector<int>(draft.begin(), draft.begin() + r));
        } catch (const DecodeError& e) {
            throw RequestError(e.what());
        }
    }

    static std::string json_number_list(const std::vector<double>& v) {
        std::string s = "[";
        char buf[32];
        for (size_t i = 0; i < v.size(); ++i) {
            std::snprintf(buf, sizeof buf, "%.9g", v[i]);
            s += (i ? "," : "") + std::string(buf);
        }
        return s + "]";
    }

    static std::vector<int> int_list(const Json* v, const char* what) {
        std::vector<int> out;
        if (!v || v->kind != Json::Array) throw RequestError(std::string(what) + " must be a list of token ids");
        for (const Json& t : v->items) {
            if (!t.is_int()) throw RequestError(std::string(what) + " must be a list of integer token ids");
            out.push_back(static_cast<int>(t.integer));
        }
        return out;
    }

    void send(Channel& ch, const std::string& line) {
        if (!ch.write_line(line)) throw PeerGone("the client closed the connection");
    }

    // ---- trees (capability trees; defined in tree.hpp)
    int tree_nodes_ = 0;  // this request's max_nodes; 0: a chain request
    bool tree_node_state_ = false;  // capability tree_state: each node's state before the round record
    void parse_tree(const Json& req, bool greedy, bool suite, bool sampling);
    void ask_tree(Channel& ch, long long id, int round, int ctx_len, int k, std::vector<int>& tokens,
                  std::vector<int>& parents);
    std::vector<int> tree_round(Channel& ch, long long id, int round, const std::vector<int>& ctx, int k_eff,
                                int remaining, int eos, StatsCounter& st, const SamplingParams* smp, Rng& rng);
    void send_node_states(Channel& ch, long long id, struct TreeForward& f, const std::vector<int>& parents);

    void keep_snapshot() {
        snaps_[m_.processed] = m_.conv_state;
        while (static_cast<int>(snaps_.size()) > opt_.max_snapshots) snaps_.erase(snaps_.begin());
    }

    // Session start: reuse the longest processed prefix shared with the new prompt, from a kept
    // snapshot of the recurrent state (KV needs none: it is append-only), then prefill the rest.
    void begin(const std::vector<int>& prompt, StatsCounter& st) {
        const int want = static_cast<int>(prompt.size()) - 1;
        int c = 0;
        const int limit = std::min(static_cast<int>(fed_.size()), want);
        while (c < limit && fed_[c] == prompt[c]) ++c;
        if (bug("never-reuses-prefix")) {
            m_.reset();  // advertises sessions, yet re-prefills every prompt from scratch
            snaps_.clear();
        } else if (c == static_cast<int>(fed_.size()) && c == m_.processed) {
            // everything processed is a prefix of the new prompt: the live state is right as it is
        } else if (bug("prefix-reuse-stale-state")) {
            m_.processed = c;  // moves the KV pointer back but keeps the conv state of the old context
        } else {
            int s = 0;
            auto it = snaps_.upper_bound(c);
            const std::vector<float>* snap = nullptr;
            if (it != snaps_.begin()) {
                --it;
                s = it->first;
                snap = &it->second;
            }
            if (snap) {
                m_.conv_state = *snap;
                m_.processed = s;
            } else {
                m_.reset();
            }
            c = m_.processed;
        }
        fed_.resize(m_.processed);
        snaps_.erase(snaps_.upper_bound(m_.processed), snaps_.end());
        st.reused = bug("overclaims-prefix-reuse") ? want : m_.processed;
        if (want > m_.processed) {
            std::vector<float> logits(static_cast<size_t>(want - m_.processed) * m_.cfg.vocab_size);
            const int start = m_.processed;
            m_.forward(prompt.data() + start, want - start, logits.data());
            fed_.insert(fed_.end(), prompt.begin() + start, prompt.begin() + want);
            st.prefill = 1;
        }
        keep_snapshot();
    }

    // Roll back to base + keep processed tokens: the KV pointer moves; the conv state becomes
    // checkpoint keep - 1 (checkpoint) or the pre-verify snapshot plus a replay of fed[:keep] (replay).
    void rollback(const std::vector<int>& fed, int base, int keep, int j, bool checkpoint, const std::vector<float>& ck,
                  const std::vector<float>& before, StatsCounter& st) {
        const bool skip = bug("skip-restore-when-zero-accepted") && j == 0;
        if (checkpoint) {
            if (!bug("stale-conv") && !skip)
                std::copy(ck.begin() + static_cast<long>((keep - 1) * m_.conv_size()),
                          ck.begin() + static_cast<long>(keep * m_.conv_size()), m_.conv_state.begin());
            if (bug("old-kv-row") && base > 1) m_.key_cache[0] += 0.01f;  // row 0 of layer 0, long reported
            m_.processed = base + keep;
            return;
        }
        if (skip) {  // keeps the state after the whole verify forward
            m_.processed = base + keep;
            return;
        }
        if (!bug("stale-conv")) m_.conv_state = before;
        if (bug("old-kv-row") && base > 1) m_.key_cache[0] += 0.01f;  // row 0 of layer 0, long reported
        m_.processed = base;
        std::vector<float> logits(static_cast<size_t>(keep) * m_.cfg.vocab_size);
        m_.forward(fed.data(), keep, logits.data());
        ++st.replay;
    }

    // The live state. With state_delta, key_cache/value_cache carry only the rows written since this
    // request's previous state message (KV is append-only: rows before it are the client's), with the
    // whole array's CRC-32 so a change to an old row still shows (docs/protocol.md, state). With
    // state_digest, arrays go as signed projections per slice instead of values (digest_of), KV from
    // the previous message's rows on, with the CRC-32 of the rows before (the client's chain).
    void send_state(Channel& ch, long long id) {
        std::ostringstream o;
        o << "{\"type\":\"state\",\"id\":" << id << ",\"processed\":" << m_.processed << ",\"arrays\":{";
        bool first = true;
        const int n = m_.processed;
        for (const auto& kv : m_.state_arrays()) {
            if (!first) o << ',';
            first = false;
            const auto& a = kv.second;
            o << json_quote(kv.first) << ":{\"dtype\":\"float32\",\"shape\":" << json_int_list(a.shape);
            const bool kv_cache = kv.first == "key_cache" || kv.first == "value_cache";
            const unsigned long whole_crc = crc32(a.data.data(), a.data.size() * 4);
            if (digest_n_ > 0) {
                // KV: one slice per layer/head/position row; conv: one per layer (a row of 3 taps is
                // as long as its digest) while a layer fits the client's slice limit (4096 elements,
                // docs/protocol.md "Limits"), else a row per channel; anything else: a row along the last axis
                int slice = 1;
                if (kv.first == "conv_state" && a.shape.size() >= 2 &&
                    static_cast<long long>(a.shape[a.shape.size() - 1]) * a.shape[a.shape.size() - 2] <= 4096)
                    slice = 2;
                const bool from_prev = kv_cache && sent_rows_ >= 0;
                const int start = from_prev ? std::min(sent_rows_, n) : 0;
                o << ",\"crc32\":" << whole_crc;
                if (slice != 1) o << ",\"slice\":" << slice;
                if (from_prev) {
                    const int hd = a.shape[3], outer = a.shape[0] * a.shape[1];
                    unsigned long head = 0;
                    for (int i = 0; i < outer; ++i)
                        head = crc32(a.data.data() + static_cast<size_t>(i) * n * hd, static_cast<size_t>(start) * hd * 4, head);
                    o << ",\"axis\":2,\"start\":" << start << ",\"prefix_crc32\":" << head;
                }
                o << ",\"digest\":\"" << digest_of(a, slice, from_prev ? 2 : -1, start) << "\"}";
            } else if (delta_ && kv_cache && sent_rows_ >= 0) {
                const int start = std::min(sent_rows_, n), hd = a.shape[3], outer = a.shape[0] * a.shape[1];
                std::vector<float> part;
                part.reserve(static_cast<size_t>(outer) * (n - start) * hd);
                for (int i = 0; i < outer; ++i) {
                    const float* src = a.data.data() + (static_cast<size_t>(i) * n + start) * hd;
                    part.insert(part.end(), src, src + static_cast<size_t>(n - start) * hd);
                }
                o << ",\"axis\":2,\"start\":" << start << ",\"crc32\":" << whole_crc
                  << ",\"data\":\"" << base64(part.data(), part.size() * 4) << "\"}";
            } else {
                o << ",\"data\":\"" << base64(a.data.data(), a.data.size() * 4) << "\"}";
            }
        }
        o << "}}";
        sent_rows_ = n;
        send(ch, o.str());
    }

    // The signs of a digest (docs/protocol.md, state; specproof/wire/_digest.py is the same in numpy):
    // for the element at multi-index (i_0..i_{R-1}) and projection j, s = seed, s = mix(s + G(i_k + 1))
    // per axis, then mix(s + G(j + 1)); the top bit set means -1. mix is splitmix64's finalizer.
    static uint64_t mix(uint64_t z) {
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    static uint64_t step(uint64_t s, uint64_t i) { return mix(s + 0x9E3779B97F4A7C15ULL * (i + 1)); }

    // base64 of the float32 projections of every slice (the last `slice` axes) from `start` along
    // `axis` (-1: all), summed in double, in C order over the leading axes.
    std::string digest_of(const Model::Array& a, int slice, int axis, int start) const {
        const int R = static_cast<int>(a.shape.size()), L = R - slice;
        size_t m = 1, count = 1;
        for (int k = L; k < R; ++k) m *= static_cast<size_t>(a.shape[k]);
        std::vector<int> lo(static_cast<size_t>(L), 0);
        if (axis >= 0) lo[static_cast<size_t>(axis)] = start;
        for (int k = 0; k < L; ++k) count *= static_cast<size_t>(std::max(0, a.shape[k] - lo[k]));
        std::vector<float> out;
        out.reserve(count * static_cast<size_t>(digest_n_));
        std::vector<int> idx = lo, t(static_cast<size_t>(slice), 0);
        double p[16];
        for (size_t c = 0; c < count; ++c) {
            uint64_t s = digest_seed_;
            size_t flat = 0;
            for (int k = 0; k < L; ++k) {
                s = step(s, static_cast<uint64_t>(idx[k]));
                flat = flat * static_cast<size_t>(a.shape[k]) + static_cast<size_t>(idx[k]);
            }
            const float* x = a.data.data() + flat * m;
            std::fill(p, p + digest_n_, 0.0);
            std::fill(t.begin(), t.end(), 0);
            for (size_t e = 0; e < m; ++e) {
                uint64_t se = s;
                for (int k = 0; k < slice; ++k) se = step(se, static_cast<uint64_t>(t[k]));
                const double v = x[e];
                for (int j = 0; j < digest_n_; ++j) p[j] += (step(se, static_cast<uint64_t>(j)) >> 63) ? -v : v;
                for (int k = slice - 1; k >= 0; --k) {
                    if (++t[k] < a.shape[L + k]) break;
                    t[k] = 0;
                }
            }
            for (int j = 0; j < digest_n_; ++j) out.push_back(static_cast<float>(p[j]));
            for (int k = L - 1; k >= 0; --k) {
                if (++idx[k] < a.shape[k]) break;
                idx[k] = lo[k];
            }
        }
        return base64(out.data(), out.size() * 4);
    }

    // zlib's CRC-32 (reflected 0xEDB88320); `prev` continues an earlier CRC, as zlib's crc32(crc, buf, len)
    static unsigned long crc32(const void* data, size_t n, unsigned long prev = 0) {
        static unsigned long table[256];
        static bool ready = false;
        if (!ready) {
            for (unsigned long i = 0; i < 256; ++i) {
                unsigned long c = i;
                for (int b = 0; b < 8; ++b) c = c & 1 ? 0xEDB88320UL ^ (c >> 1) : c >> 1;
                table[i] = c;
            }
            ready = true;
        }
        unsigned long c = (prev ^ 0xFFFFFFFFUL) & 0xFFFFFFFFUL;
        const unsigned char* p = static_cast<const unsigned char*>(data);
        for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
        return (c ^ 0xFFFFFFFFUL) & 0xFFFFFFFFUL;
    }

    // Send a propose and read the client's answer: the draft message (the chain's and the tree's ask alike).
    Json propose(Channel& ch, const std::string& message) {
        send(ch, message);
        const auto t0 = Clock::now();
        std::string line;
        if (!ch.read_line(line)) throw PeerGone("the client closed the connection while the engine waited for a draft");
        io_us_ += us_since(t0);
        Json msg;
        try {
            msg = parse_json(line);
        } catch (const JsonError& e) {
            throw RequestError(std::string("expected a draft message, got invalid JSON: ") + e.what());
        }
        const Json* type = msg.get("type");
        if (!type || type->str != "draft") throw RequestError("expected a draft message in answer to propose");
        return msg;
    }

    std::vector<int> ask_draft(Channel& ch, long long id, int round, int ctx_len, int k,
                               std::vector<std::vector<double>>* qrows, const std::string* request = nullptr) {
        std::ostringstream o;
        o << "{\"type\":\"propose\",\"id\":" << id << ",\"round\":" << round << ",\"context_length\":" << ctx_len
          << ",\"k\":" << k;
        if (request) o << ",\"request\":" << json_quote(*request);
        o << "}";
        const Json msg = propose(ch, o.str());
        if (request) {
            const Json* rv = msg.get("request");
            if (!rv || rv->kind != Json::String || rv->str != *request)
                throw RequestError("the draft must name the request its propose named ('" + *request + "')");
        }
        std::vector<int> draft = int_list(msg.get("tokens"), "draft tokens");
        if (static_cast<int>(draft.size()) > k)
            throw RequestError("the draft has " + std::to_string(draft.size()) + " tokens, more than k=" + std::to_string(k));
        for (int t : draft)
            if (t < 0 || t >= m_.cfg.vocab_size) throw RequestError("a draft token is outside the vocabulary");
        parse_q(msg.get("q"), draft, qrows);
        return draft;
    }
};

}  // namespace sp
#include "tree.hpp"  // the Engine's tree rounds (capability trees)
namespace sp {

// --------------------------------------------------------------------------- serving

static std::string error_message(long long id, bool has_id, const std::string& msg) {
    std::ostringstream o;
    o << "{\"type\":\"error\",\"id\":";
    if (has_id) o << id;
    else o << "null";
    o << ",\"message\":" << json_quote(msg) << "}";
    return o.str();
}

// Serve one client until shutdown (returns true) or end of input (returns false).
static bool serve(Engine& engine, Channel& ch) {
    if (!ch.write_line(engine.hello())) return false;
    std::string line;
    while (ch.read_line(line)) {
        if (line.empty()) continue;
        long long id = 0;
        bool has_id = false;
        try {
            Json req;
            try {
                req = parse_json(line);
            } catch (const JsonError& e) {
                throw RequestError(std::string("invalid JSON: ") + e.what());
            }
            const Json* idv = req.get("id");
            if (idv && idv->is_int()) {
                id = idv->integer;
                has_id = true;
            }
            const Json* type = req.get("type");
            if (!type || type->kind != Json::String) throw RequestError("a request needs a string 'type'");
            if (!has_id) throw RequestError("a request needs an integer 'id'");
            const std::string& t = type->str;
            if (t == "generate" || t == "greedy") {
                const Json* mnt = req.get("max_new_tokens");
                if (!mnt || !mnt->is_int() || mnt->integer < 0) throw RequestError("max_new_tokens must be an integer >= 0");
                try {
                    engine.run(ch, req, t == "greedy");
                } catch (const RequestError&) {
                    engine.reset();  // a request that failed half-way leaves no usable session
                    throw;
                }
            } else if (t == "add_request" || t == "step" || t == "abort" || t == "preempt") {
                try {
                    if (t == "add_request") engine.add_request(req);
                    else if (t == "preempt") engine.preempt(req);
                    else if (t == "abort") engine.abort(ch, id, req);
                    else engine.step(ch, id, req);
                } catch (const RequestError&) {
                    // a step that failed once running (a bad draft) drops the batch; one refused up front does not
                    if (t == "step" && engine.step_started()) engine.batch_reset();
                    throw;
                }
                if (t == "add_request" || t == "preempt") ch.write_line("{\"type\":\"ok\",\"id\":" + std::to_string(id) + "}");
            } else if (t == "reset") {
                engine.reset();
                ch.write_line("{\"type\":\"ok\",\"id\":" + std::to_string(id) + "}");
            } else if (t == "shutdown") {
                ch.write_line("{\"type\":\"ok\",\"id\":" + std::to_string(id) + "}");
                return true;
            } else {
                throw RequestError("unknown request type '" + t + "'");
            }
        } catch (const RequestError& e) {
            if (!ch.write_line(error_message(id, has_id, e.what()))) return false;
        } catch (const PeerGone&) {
            return false;
        }
    }
    return false;
}

static int listen_loop(Engine& engine, int port) {
    int srv = ::socket(AF_INET, SOCK_STREAM, 0);
    if (srv < 0) {
        std::perror("socket");
        return 1;
    }
    int one = 1;
    ::setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 || ::listen(srv, 4) < 0) {
        std::perror("bind/listen");
        return 1;
    }
    socklen_t len = sizeof addr;
    ::getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len);
    // the first stdout line says where to connect (port 0 picks a free one)
    std::printf("listening 127.0.0.1:%d\n", ntohs(addr.sin_port));
    std::fflush(stdout);
    for (;;) {
        int fd = ::accept(srv, nullptr, nullptr);
        if (fd < 0) {
            if (errno == EINTR) continue;
            std::perror("accept");
            return 1;
        }
        int nodelay = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
        Channel ch(fd, fd);
        engine.reset();  // every connection starts a new session
        bool shutdown = serve(engine, ch);
        ::close(fd);
        if (shutdown) break;
    }
    ::close(srv);
    return 0;
}

// --------------------------------------------------------------------------- test / bench modes

static int logits_mode(Model& m, const std::string& in_path, const std::string& out_path) {
    std::ifstream f(in_path);
    std::stringstream ss;
    ss << f.rdbuf();
    Json req = parse_json(ss.str());
    std::vector<int> toks;
    for (const Json& t : req.get("tokens")->items) toks.push_back(static_cast<int>(t.integer));
    int chunk = static_cast<int>(toks.size());
    if (const Json* c = req.get("chunk")) chunk = std::max(1, static_cast<int>(c->integer));
    std::vector<float> all(toks.size() * m.cfg.vocab_size);
    m.reset();
    for (size_t i = 0; i < toks.size(); i += chunk) {
        int q = static_cast<int>(std::min(toks.size() - i, static_cast<size_t>(chunk)));
        m.forward(toks.data() + i, q, all.data() + i * m.cfg.vocab_size);
    }
    std::ofstream out(out_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
    // and the state after the whole sequence, for state comparisons
    std::ofstream st(out_path + ".state", std::ios::binary);
    for (const auto& kv : m.state_arrays())
        st.write(reinterpret_cast<const char*>(kv.second.data.data()), static_cast<std::streamsize>(kv.second.data.size() * 4));
    return 0;
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Speed figures without the protocol: greedy vs speculative (own n-gram drafter) per rollback,
// and the one-token step vs (k+1)-token verify forward time.
static int bench_mode(Model& m, const Options& opt, const std::string& prompt_path, int tokens) {
    std::ifstream f(prompt_path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<int> prompt(text.begin(), text.end());
    for (int& t : prompt) t &= 0xFF;
    std::ostringstream o;
    o << "{\"prompt_tokens\":" << prompt.size() << ",\"max_new_tokens\":" << tokens << ",\"k\":" << opt.k;
    std::vector<float> logits(static_cast<size_t>(opt.k + 1) * m.cfg.vocab_size);
    // step vs verify: same prefix, forward then roll back, alternating
    {
        m.reset();
        std::vector<float> pl(prompt.size() * m.cfg.vocab_size);
        m.forward(prompt.data(), static_cast<int>(prompt.size()) - 1, pl.data());
        const int base = m.processed;
        std::vector<float> snap = m.conv_state;
        std::vector<double> step, verify;
        std::vector<int> fed(prompt.end() - (opt.k + 1), prompt.end());
        for (int it = 0; it < 200; ++it) {
            auto t0 = Clock::now();
            m.forward(fed.data(), 1, logits.data());
            step.push_back(us_since(t0));
            m.conv_state = snap;
            m.processed = base;
            t0 = Clock::now();
            m.forward(fed.data(), opt.k + 1, logits.data());
            verify.push_back(us_since(t0));
            m.conv_state = snap;
            m.processed = base;
        }
        o << ",\"step_us_median\":" << median(step) << ",\"verify_us_median\":" << median(verify);
    }
    // mode -1: prefill only; the rates are decode-only (the engine reports prefill_us separately)
    for (int mode = -1; mode < 3; ++mode) {
        Options o2 = opt;
        o2.rollback = mode == 2 ? "replay" : "checkpoint";
        Engine e(m, o2);
        e.reset();
        std::ostringstream req;
        req << "{\"type\":\"" << (mode <= 0 ? "greedy" : "generate") << "\",\"id\":1,\"prompt\":" << json_int_list(prompt)
            << ",\"max_new_tokens\":" << (mode < 0 ? 0 : tokens) << ",\"drafts\":\"engine\"}";
        // run through the engine without a client: its messages go to a pipe, the final line is read back
        int fds[2];
        if (::pipe(fds) != 0) return 1;
        Channel out(-1, fds[1]);
        std::string all;
        std::thread drain([&] {
            char buf[65536];
            ssize_t n;
            while ((n = ::read(fds[0], buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
        });
        e.run(out, parse_json(req.str()), mode <= 0);
        ::close(fds[1]);
        drain.join();
        ::close(fds[0]);
        const size_t end = all.find_last_not_of('\n');
        const size_t start = all.rfind('\n', end);
        Json fin = parse_json(all.substr(start == std::string::npos ? 0 : start + 1, end - start));
        const double us = fin.get("elapsed_us")->number - fin.get("prefill_us")->number;
        if (mode < 0) {
            o << ",\"prefill_us\":" << fin.get("prefill_us")->number;
            continue;
        }
        const int emitted = static_cast<int>(fin.get("tokens")->items.size());
        int rounds = emitted;
        if (const Json* s = fin.get("stats")) rounds = static_cast<int>(s->get("rounds")->integer);
        const double decode_s = us / 1e6;
        const char* name = mode == 0 ? "greedy" : (mode == 1 ? "spec_checkpoint" : "spec_replay");
        o << ",\"" << name << "\":{\"tokens\":" << emitted << ",\"rounds\":" << rounds << ",\"decode_seconds\":" << decode_s
          << ",\"tokens_per_s\":" << emitted / decode_s << ",\"tokens_per_round\":" << static_cast<double>(emitted) / rounds;
        if (const Json* s = fin.get("stats")) o << ",\"replay_forwards\":" << s->get("replay_forwards")->integer;
        o << "}";
    }
    o << "}";
    std::cout << o.str() << std::endl;
    return 0;
}

}  // namespace sp

static void usage() {
    std::cerr << "usage: specproof-engine --weights FILE.safetensors [--k N] [--rollback checkpoint|replay]\n"
                 "                        [--scheme rejection|match] [--bug NAME]... [--listen PORT] [--max-context N] [--slots N]\n"
                 "       specproof-engine --weights FILE --logits IN.json OUT.f32\n"
                 "       specproof-engine --weights FILE --bench PROMPT_FILE [--tokens N] [--k N]\n"
                 "bugs:";
    for (const char* b : sp::kBugs) std::cerr << " " << b;
    std::cerr << "\n";
}

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    sp::Options opt;
    std::string logits_in, logits_out, bench;
    int bench_tokens = 256;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&](const char* what) -> std::string {
            if (i + 1 >= argc) {
                std::cerr << "specproof-engine: " << a << " needs " << what << "\n";
                std::exit(2);
            }
            return argv[++i];
        };
        try {
            if (a == "--weights") opt.weights = next("a file");
            else if (a == "--k") opt.k = std::stoi(next("an integer"));
            else if (a == "--rollback") opt.rollback = next("checkpoint or replay");
            else if (a == "--scheme") opt.scheme = next("rejection or match");
            else if (a == "--bug") opt.bugs.insert(next("a bug name"));
            else if (a == "--listen") opt.listen_port = std::stoi(next("a port"));
            else if (a == "--max-context") opt.max_context = std::stoi(next("an integer"));
            else if (a == "--slots") opt.slots = std::stoi(next("an integer"));
            else if (a == "--logits") {
                logits_in = next("IN.json");
                logits_out = next("OUT.f32");
            } else if (a == "--bench") bench = next("a prompt file");
            else if (a == "--tokens") bench_tokens = std::stoi(next("an integer"));
            else if (a == "--help" || a == "-h") {
                usage();
                return 0;
            } else {
                std::cerr << "specproof-engine: unknown argument '" << a << "'\n";
                usage();
                return 2;
            }
        } catch (const std::exception&) {
            std::cerr << "specproof-engine: bad value for " << a << "\n";
            return 2;
        }
    }
    if (opt.weights.empty()) {
        usage();
        return 2;
    }
    if (opt.k < 0 || (opt.rollback != "checkpoint" && opt.rollback != "replay")) {
        std::cerr << "specproof-engine: --k must be >= 0 and --rollback checkpoint or replay\n";
        return 2;
    }
    if (opt.scheme != "rejection" && opt.scheme != "match") {
        std::cerr << "specproof-engine: --scheme must be rejection or match\n";
        return 2;
    }
    for (const auto& b : opt.bugs) {
        bool known = false;
        for (const char* k : sp::kBugs) known |= b == k;
        if (!known) {
            std::cerr << "specproof-engine: unknown --bug '" << b << "'\n";
            usage();
            return 2;
        }
    }
    try {
        sp::Model model(opt.weights);
        std::cerr << "specproof-engine " << sp::kVersion << ": " << model.cfg.layers.size() << " blocks, d_model "
                  << model.cfg.d_model << ", vocab " << model.cfg.vocab_size << ", k=" << opt.k << ", rollback=" << opt.rollback
                  << ", scheme=" << opt.scheme;
        for (const auto& b : opt.bugs) std::cerr << ", bug " << b;
        std::cerr << std::endl;
        if (!logits_in.empty()) return sp::logits_mode(model, logits_in, logits_out);
        if (!bench.empty()) return sp::bench_mode(model, opt, bench, bench_tokens);
        sp::Engine engine(model, opt);
        if (opt.listen_port >= 0) return sp::listen_loop(engine, opt.listen_port);
        sp::Channel ch(0, 1);
        sp::serve(engine, ch);
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "specproof-engine: " << e.what() << std::endl;
        return 1;
    }
}
