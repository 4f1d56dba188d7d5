// Decode-time state for the native engine (docs/protocol.md, Decode state; docs/contract.md, Decode state):
// one request's logits processors (repetition / presence / frequency penalties, a logit bias, bad words,
// min_tokens), its stops (several EOS ids, token-sequence stops) and its logprobs.
//
// A verify row i is processed with the state advanced through draft[:i] (computed on the committed
// output plus the draft before the row; nothing moves on the draft), and only the tokens a round emits
// are committed, so a rejection needs no undo: the committed state is the checkpoint. The planted bug
// `penalty-counts-rejected` commits the round's rejected draft tokens to the penalty buffer too (the
// llama.cpp checkpoint-sampler class).
//
// The arithmetic is double over the float32 row, in the contract's order: (1) repetition penalty,
// (2) presence and frequency penalties (one subtraction), (3) logit bias, (4) bad words, (5) min_tokens.
// No grammar: a grammar (capability `grammar`) is not implemented by this engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "json.hpp"

namespace sp {

struct DecodeParams {
    double repetition = 1.0, presence = 0.0, frequency = 0.0;
    std::vector<std::pair<int, double>> bias;
    std::vector<std::vector<int>> bad_words;
    int min_tokens = 0;
    std::vector<int> eos_ids;
    std::vector<std::vector<int>> stops;
};

// A bad `decode` object: the request is answered with an error naming the field.
struct DecodeError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

namespace detail {

inline double number_in(const Json& v, const std::string& name, double low, double high, bool low_open) {
    if (v.kind != Json::Number || !std::isfinite(v.number) || v.number < low || (low_open && v.number == low) ||
        v.number > high)
        throw DecodeError("decode." + name + " must be a number in " + (low_open ? "(" : "[") +
                          std::to_string(low) + ", " + std::to_string(high) + "]");
    return v.number;
}

inline int token_in(const Json& v, const std::string& name, int vocab) {
    if (!v.is_int() || v.integer < 0 || v.integer >= vocab)
        throw DecodeError("decode." + name + " holds a value that is not a token id in [0, " + std::to_string(vocab) + ")");
    return static_cast<int>(v.integer);
}

inline std::vector<std::vector<int>> sequences(const Json& v, const std::string& name, int vocab) {
    if (v.kind != Json::Array) throw DecodeError("decode." + name + " must be a list of token-id sequences");
    std::vector<std::vector<int>> out;
    for (const Json& seq : v.items) {
        if (seq.kind != Json::Array || seq.items.empty())
            throw DecodeError("decode." + name + " must hold non-empty lists of token ids");
        std::vector<int> tokens;
        for (const Json& t : seq.items) tokens.push_back(token_in(t, name, vocab));
        out.push_back(tokens);
    }
    return out;
}

}  // namespace detail

// The `decode` object of a generate (generate.json's closed schema; an unknown field is an error).
inline DecodeParams parse_decode(const Json& d, int vocab) {
    if (d.kind != Json::Object) throw DecodeError("decode must be an object");
    DecodeParams p;
    for (const auto& kv : d.fields) {
        const std::string& k = kv.first;
        const Json& v = kv.second;
        if (k == "repetition_penalty") {
            p.repetition = detail::number_in(v, k, 0.0, 100.0, true);
        } else if (k == "presence_penalty") {
            p.presence = detail::number_in(v, k, -100.0, 100.0, false);
        } else if (k == "frequency_penalty") {
            p.frequency = detail::number_in(v, k, -100.0, 100.0, false);
        } else if (k == "logit_bias") {
            if (v.kind != Json::Object) throw DecodeError("decode.logit_bias must be an object: token id -> bias");
            for (const auto& b : v.fields) {
                size_t used = 0;
                long long t = -1;
                try {
                    t = std::stoll(b.first, &used);
                } catch (const std::exception&) {
                    used = 0;
                }
                if (used == 0 || used != b.first.size() || t < 0 || t >= vocab)
                    throw DecodeError("decode.logit_bias key '" + b.first + "' is not a token id in [0, " +
                                      std::to_string(vocab) + ")");
                p.bias.emplace_back(static_cast<int>(t), detail::number_in(b.second, "logit_bias", -100.0, 100.0, false));
            }
        } else if (k == "bad_words") {
            p.bad_words = detail::sequences(v, k, vocab);
        } else if (k == "min_tokens") {
            if (!v.is_int() || v.integer < 0 || v.integer > 1000000000) throw DecodeError("decode.min_tokens must be an integer >= 0");
            p.min_tokens = static_cast<int>(v.integer);
        } else if (k == "eos_token_ids") {
            if (v.kind != Json::Array) throw DecodeError("decode.eos_token_ids must be a list of token ids");
            for (const Json& t : v.items) p.eos_ids.push_back(detail::token_in(t, k, vocab));
        } else if (k == "stop") {
            p.stops = detail::sequences(v, k, vocab);
        } else {
            throw DecodeError("decode has an unknown field '" + k + "'");
        }
    }
    return p;
}

class RequestProcessors {
   public:
    RequestProcessors() = default;
    // `eos`: generate's eos_token_id (-1: none), beside decode.eos_token_ids
    RequestProcessors(const DecodeParams& p, const std::vector<int>& prompt, int eos, int vocab)
        : p_(p), vocab_(vocab), in_prompt_(static_cast<size_t>(vocab), 0), counts_(static_cast<size_t>(vocab), 0) {
        for (int t : prompt) in_prompt_[static_cast<size_t>(t)] = 1;
        eos_.insert(p.eos_ids.begin(), p.eos_ids.end());
        if (eos >= 0) eos_.insert(eos);
    }

    // Process verify row `row` (float32, in place) for the position after the output and `ahead` (the
    // draft tokens before this row).
    void process(float* row, const std::vector<int>& ahead) const {
        std::map<int, int> extra;  // the draft's tokens before this row, counted on top of the committed ones
        for (int t : ahead) ++extra[t];
        auto count = [&](int t) {
            auto it = extra.find(t);
            return counts_[static_cast<size_t>(t)] + (it == extra.end() ? 0 : it->second);
        };
        const bool penalties = p_.repetition != 1.0 || p_.presence != 0.0 || p_.frequency != 0.0;
        if (penalties) {
            for (int t = 0; t < vocab_; ++t) {
                const int n = count(t);
                double z = row[t];
                if (p_.repetition != 1.0 && (n > 0 || in_prompt_[static_cast<size_t>(t)]))
                    z = z > 0 ? z / p_.repetition : z * p_.repetition;
                if (n > 0) z -= p_.frequency * n + p_.presence;
                row[t] = static_cast<float>(z);
            }
        }
        for (const auto& b : p_.bias) row[b.first] = static_cast<float>(static_cast<double>(row[b.first]) + b.second);
        const size_t have = output_.size() + ahead.size();
        for (const auto& word : p_.bad_words) {
            const size_t head = word.size() - 1;
            bool ends = head <= have;
            for (size_t i = 0; ends && i < head; ++i) ends = at(have - head + i, ahead) == word[i];
            if (ends) row[word.back()] = -std::numeric_limits<float>::infinity();
        }
        if (static_cast<int>(have) < p_.min_tokens)
            for (int t : eos_) row[t] = -std::numeric_limits<float>::infinity();
        if (std::none_of(row, row + vocab_, [](float z) { return std::isfinite(z); }))
            throw DecodeError("the decode processors masked every token at output position " + std::to_string(have));
    }

    // `emitted` cut after its first stop (an EOS id, else a stop sequence ending there, which may have
    // begun in an earlier round); the stop reason ("" when none).
    std::string cut(std::vector<int>& emitted) const {
        std::vector<int> tail = output_;
        for (size_t i = 0; i < emitted.size(); ++i) {
            tail.push_back(emitted[i]);
            std::string reason;
            if (eos_.count(emitted[i])) {
                reason = "eos";
            } else {
                for (const auto& s : p_.stops)
                    if (s.size() <= tail.size() && std::equal(s.begin(), s.end(), tail.end() - s.size())) reason = "stop_sequence";
            }
            if (!reason.empty()) {
                emitted.resize(i + 1);
                return reason;
            }
        }
        return "";
    }

    // Advance the committed state by the round's emitted tokens; `rejected` (the draft tokens past the
    // accepted ones) go into the penalty buffer only under the planted bug.
    void commit(const std::vector<int>& emitted, const std::vector<int>& rejected, bool count_rejected) {
        for (int t : emitted) {
            output_.push_back(t);
            ++counts_[static_cast<size_t>(t)];
        }
        if (count_rejected)
            for (int t : rejected) ++counts_[static_cast<size_t>(t)];
    }

    // log-softmax of a processed row at `token` (docs/protocol.md, Decode state: logprobs)
    static double logprob(const float* row, int vocab, int token) {
        const double top = *std::max_element(row, row + vocab);
        double sum = 0.0;
        for (int t = 0; t < vocab; ++t)
            if (std::isfinite(row[t])) sum += std::exp(static_cast<double>(row[t]) - top);
        return static_cast<double>(row[token]) - top - std::log(sum);
    }

    // The state after the committed output, as round.processor carries it: {"generated": n, "counts": {...}}
    std::string state_json() const {
        std::string s = "{\"generated\":" + std::to_string(output_.size()) + ",\"counts\":{";
        bool first = true;
        for (int t = 0; t < vocab_; ++t) {
            if (!counts_[static_cast<size_t>(t)]) continue;
            s += (first ? "\"" : ",\"") + std::to_string(t) + "\":" + std::to_string(counts_[static_cast<size_t>(t)]);
            first = false;
        }
        return s + "}}";
    }

   private:
    int at(size_t i, const std::vector<int>& ahead) const {
        return i < output_.size() ? output_[i] : ahead[i - output_.size()];
    }

    DecodeParams p_;
    int vocab_ = 0;
    std::vector<char> in_prompt_;
    std::vector<int> counts_;  // the penalty buffer: each token's count in the committed output
    std::vector<int> output_;  // the committed output (bad words, min_tokens, stops)
    std::set<int> eos_;
};

}  // namespace sp
