// The trained fixture's forward in float32: LFM2 gated short conv + GQA attention blocks
// (RoPE, per-head QK RMSNorm), SwiGLU feed-forward, RMSNorms, tied head.
//
// Mirrors specproof.engine.targets.reference.ReferenceHybrid op for op. Every row goes
// through the same arithmetic whatever the number of rows in the forward (each output
// of a projection is one dot product in a fixed order; attention row i reads keys
// 0..base+i), so a forward of q tokens equals q one-token forwards bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

namespace sp {

struct Config {
    int vocab_size = 256;
    int d_model = 96;
    std::vector<std::string> layers;
    int n_heads = 4;
    int n_kv_heads = 2;
    int head_dim = 24;
    int ffn_dim = 256;
    int conv_kernel = 4;
    double rope_theta = 10000.0;
    double norm_eps = 1e-5;
    int max_context = 4096;
    bool tie_embeddings = true;
    // only for the (empty) rec_state's reported shape: the reference allocates
    // [n_gdn_layers, gdn_heads, gdn_key_dim, gdn_value_dim] even when there is no gdn block
    int gdn_heads = 2, gdn_key_dim = 16, gdn_value_dim = 16;
};

class ModelError : public std::runtime_error {
   public:
    using std::runtime_error::runtime_error;
};

// --------------------------------------------------------------------------- kernels

// dot product with 8 independent accumulators summed in a fixed order
static inline float dot(const float* a, const float* b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// y[q][m] = x[q][n] @ W[m][n]^T; each weight row is read once for all q rows
static inline void linear(const float* x, int q, int n, const float* w, int m, float* y) {
    for (int o = 0; o < m; ++o) {
        const float* wr = w + static_cast<size_t>(o) * n;
        for (int r = 0; r < q; ++r) y[static_cast<size_t>(r) * m + o] = dot(wr, x + static_cast<size_t>(r) * n, n);
    }
}

static inline void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
    float ms = dot(x, x, n);
    ms /= static_cast<float>(n);
    ms += eps;
    float root = std::sqrt(ms);
    for (int i = 0; i < n; ++i) out[i] = x[i] / root * w[i];
}

static inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// --------------------------------------------------------------------------- model

struct Block {
    bool attn = false;
    int slot = 0;  // index among conv blocks or among attention blocks
    const float* op_norm = nullptr;
    const float* ffn_norm = nullptr;
    // conv
    const float* in_proj = nullptr;   // [3d, d]
    std::vector<float> kernel;        // [L, d]: kernel[tap * d + c]
    const float* out_proj = nullptr;  // [d, d] or [d, n_heads*hd]
    // attn
    std::vector<float> qkv;           // [(nh + 2 nkv) * hd, d]
    const float* q_norm = nullptr;    // [hd]
    const float* k_norm = nullptr;    // [hd]
    // ffn
    std::vector<float> w13;           // [2f, d]
    const float* w2 = nullptr;        // [d, f]
};

class Model {
   public:
    Config cfg;
    std::string model_spec;  // e.g. "trained": the specproof target spec of the same model
    int n_conv = 0, n_attn = 0;

    explicit Model(const std::string& path) { load(path); }

    // ---- state
    int processed = 0;
    std::vector<float> key_cache, value_cache;  // [n_attn][n_kv][max_context][hd]
    std::vector<float> conv_state;              // [n_conv][L-1][d] (time-major; dumped as [n_conv][d][L-1])

    size_t conv_size() const { return conv_state.size(); }

    void reset() {
        processed = 0;
        std::fill(conv_state.begin(), conv_state.end(), 0.0f);
    }

    // Feed q tokens after the processed ones; logits [q][vocab]. With checkpoints, (*ck)[i] is
    // conv_state after tokens[0..i]. Callers check capacity and token range first.
    void forward(const int* tokens, int q, float* logits, std::vector<float>* ck = nullptr) {
        const Config& c = cfg;
        const int d = c.d_model, L = c.conv_kernel, W = L - 1;
        const float eps = static_cast<float>(c.norm_eps);
        const int base = processed;
        if (q <= 0) return;
        if (ck) ck->assign(static_cast<size_t>(q) * conv_size(), 0.0f);
        h_.assign(static_cast<size_t>(q) * d, 0.0f);
        x_.resize(static_cast<size_t>(q) * d);
        for (int r = 0; r < q; ++r) std::memcpy(&h_[r * d], embed_ + static_cast<size_t>(tokens[r]) * d, d * 4);
        for (const Block& b : blocks_) {
            for (int r = 0; r < q; ++r) rms_norm(&h_[r * d], b.op_norm, d, eps, &x_[r * d]);
            if (!b.attn) {
                conv_op(b, q, base, ck, W);
            } else {
                attn_op(b, q, base);
            }
            for (int r = 0; r < q; ++r) rms_norm(&h_[r * d], b.ffn_norm, d, eps, &x_[r * d]);
            const int f = c.ffn_dim;
            t1_.resize(static_cast<size_t>(q) * 2 * f);
            linear(x_.data(), q, d, b.w13.data(), 2 * f, t1_.data());
            t2_.resize(static_cast<size_t>(q) * f);
            for (int r = 0; r < q; ++r)
                for (int i = 0; i < f; ++i) t2_[r * f + i] = silu(t1_[r * 2 * f + i]) * t1_[r * 2 * f + f + i];
            t3_.resize(static_cast<size_t>(q) * d);
            linear(t2_.data(), q, f, b.w2, d, t3_.data());
            for (size_t i = 0; i < h_.size(); ++i) h_[i] += t3_[i];
        }
        for (int r = 0; r < q; ++r) rms_norm(&h_[r * d], final_norm_, d, eps, &x_[r * d]);
        linear(x_.data(), q, d, head_, c.vocab_size, logits);
        processed = base + q;
    }

    // The four states as the reference's state_arrays(): name -> (shape, data)
    struct Array {
        std::vector<int> shape;
        std::vector<float> data;
    };
    std::vector<std::pair<std::string, Array>> state_arrays() const {
        const Config& c = cfg;
        const int n = processed, hd = c.head_dim, W = c.conv_kernel - 1, d = c.d_model;
        std::vector<std::pair<std::string, Array>> out;
        for (int which = 0; which < 2; ++which) {
            const std::vector<float>& cache = which == 0 ? key_cache : value_cache;
            Array a;
            a.shape = {n_attn, c.n_kv_heads, n, hd};
            a.data.reserve(static_cast<size_t>(n_attn) * c.n_kv_heads * n * hd);
            for (int l = 0; l < n_attn; ++l)
                for (int g = 0; g < c.n_kv_heads; ++g) {
                    const float* src = &cache[kv_index(l, g, 0)];
                    a.data.insert(a.data.end(), src, src + static_cast<size_t>(n) * hd);
                }
            out.emplace_back(which == 0 ? "key_cache" : "value_cache", std::move(a));
        }
        Array conv;
        conv.shape = {n_conv, d, W};
        conv.data.resize(static_cast<size_t>(n_conv) * d * W);
        for (int l = 0; l < n_conv; ++l)
            for (int ch = 0; ch < d; ++ch)
                for (int t = 0; t < W; ++t)
                    conv.data[(static_cast<size_t>(l) * d + ch) * W + t] = conv_state[(static_cast<size_t>(l) * W + t) * d + ch];
        out.emplace_back("conv_state", std::move(conv));
        Array rec;
        rec.shape = {0, c.gdn_heads, c.gdn_key_dim, c.gdn_value_dim};
        out.emplace_back("rec_state", std::move(rec));
        return out;
    }

    size_t weight_bytes() const { return blob_.size(); }

   private:
    std::vector<char> blob_;
    std::map<std::string, const float*> tensors_;
    std::vector<Block> blocks_;
    const float* embed_ = nullptr;
    const float* final_norm_ = nullptr;
    const float* head_ = nullptr;
    std::vector<float> cos_, sin_signed_;  // [max_context][hd]
    std::vector<float> h_, x_, t1_, t2_, t3_, bcx_, full_, att_, scores_;

    size_t kv_index(int layer, int g, int pos) const {
        const Config& c = cfg;
        return ((static_cast<size_t>(layer) * c.n_kv_heads + g) * c.max_context + pos) * c.head_dim;
    }

    void conv_op(const Block& b, int q, int base, std::vector<float>* ck, int W) {
        (void)base;
        const int d = cfg.d_model;
        bcx_.resize(static_cast<size_t>(q) * 3 * d);
        linear(x_.data(), q, d, b.in_proj, 3 * d, bcx_.data());
        // full = [state rows (W), B*x rows (q)], time-major [W + q][d]
        full_.resize(static_cast<size_t>(W + q) * d);
        float* state = &conv_state[static_cast<size_t>(b.slot) * W * d];
        std::memcpy(full_.data(), state, static_cast<size_t>(W) * d * 4);
        for (int r = 0; r < q; ++r)
            for (int ch = 0; ch < d; ++ch)
                full_[(W + r) * d + ch] = bcx_[r * 3 * d + ch] * bcx_[r * 3 * d + 2 * d + ch];
        std::memcpy(state, &full_[static_cast<size_t>(q) * d], static_cast<size_t>(W) * d * 4);
        if (ck)
            for (int r = 0; r < q; ++r)
                std::memcpy(&(*ck)[r * conv_size() + static_cast<size_t>(b.slot) * W * d], &full_[(r + 1) * d],
                            static_cast<size_t>(W) * d * 4);
        // y = C * conv(B*x); taps summed in a fixed order
        t1_.resize(static_cast<size_t>(q) * d);
        for (int r = 0; r < q; ++r)
            for (int ch = 0; ch < d; ++ch) {
                float acc = full_[r * d + ch] * b.kernel[ch];
                for (int tap = 1; tap <= W; ++tap) acc += full_[(r + tap) * d + ch] * b.kernel[tap * d + ch];
                t1_[r * d + ch] = bcx_[r * 3 * d + d + ch] * acc;
            }
        t3_.resize(static_cast<size_t>(q) * d);
        linear(t1_.data(), q, d, b.out_proj, d, t3_.data());
        for (size_t i = 0; i < static_cast<size_t>(q) * d; ++i) h_[i] += t3_[i];
    }

    void attn_op(const Block& b, int q, int base) {
        const Config& c = cfg;
        const int d = c.d_model, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim, half = hd / 2;
        const int width = (nh + 2 * nkv) * hd, group = nh / nkv;
        const float eps = static_cast<float>(c.norm_eps);
        const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
        bcx_.resize(static_cast<size_t>(q) * width);
        linear(x_.data(), q, d, b.qkv.data(), width, bcx_.data());
        std::vector<float> normed(hd), roped(static_cast<size_t>(q) * (nh + nkv) * hd);
        for (int r = 0; r < q; ++r) {
            const int pos = base + r;
            const float* cs = &cos_[static_cast<size_t>(pos) * hd];
            const float* sn = &sin_signed_[static_cast<size_t>(pos) * hd];
            for (int head = 0; head < nh + nkv; ++head) {
                rms_norm(&bcx_[r * width + head * hd], head < nh ? b.q_norm : b.k_norm, hd, eps, normed.data());
                float* out = &roped[(static_cast<size_t>(r) * (nh + nkv) + head) * hd];
                for (int i = 0; i < hd; ++i) {
                    int p = i < half ? i + half : i - half;
                    out[i] = normed[i] * cs[i] + normed[p] * sn[i];
                }
            }
            for (int g = 0; g < nkv; ++g) {
                std::memcpy(&key_cache[kv_index(b.slot, g, pos)], &roped[(static_cast<size_t>(r) * (nh + nkv) + nh + g) * hd], hd * 4);
                std::memcpy(&value_cache[kv_index(b.slot, g, pos)], &bcx_[r * width + (nh + nkv) * hd + g * hd], hd * 4);
            }
        }
        att_.assign(static_cast<size_t>(q) * nh * hd, 0.0f);
        std::vector<float> qs(hd), acc(hd);
        for (int r = 0; r < q; ++r) {
            const int n = base + r + 1;
            scores_.resize(n);
            for (int head = 0; head < nh; ++head) {
                const int g = head / group;
                const float* qh = &roped[(static_cast<size_t>(r) * (nh + nkv) + head) * hd];
                for (int i = 0; i < hd; ++i) qs[i] = qh[i] * scale;
                const float* kc = &key_cache[kv_index(b.slot, g, 0)];
                const float* vc = &value_cache[kv_index(b.slot, g, 0)];
                float mx = -INFINITY;
                for (int j = 0; j < n; ++j) {
                    scores_[j] = dot(qs.data(), kc + static_cast<size_t>(j) * hd, hd);
                    mx = std::max(mx, scores_[j]);
                }
                float sum = 0.0f;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int j = 0; j < n; ++j) {
                    float e = std::exp(scores_[j] - mx);
                    sum += e;
                    const float* vr = vc + static_cast<size_t>(j) * hd;
                    for (int i = 0; i < hd; ++i) acc[i] += e * vr[i];
                }
                float* o = &att_[(static_cast<size_t>(r) * nh + head) * hd];
                for (int i = 0; i < hd; ++i) o[i] = acc[i] / sum;
            }
        }
        t3_.resize(static_cast<size_t>(q) * d);
        linear(att_.data(), q, nh * hd, b.out_proj, d, t3_.data());
        for (size_t i = 0; i < static_cast<size_t>(q) * d; ++i) h_[i] += t3_[i];
    }

    // ------------------------------------------------------------------ loading

    const float* tensor(const std::string& name, std::vector<long long> shape) {
        auto it = tensors_.find(name);
        if (it == tensors_.end()) throw ModelError("weights: missing tensor '" + name + "'");
        auto sh = shapes_.find(name)->second;
        if (sh != shape) throw ModelError("weights: tensor '" + name + "' has the wrong shape for the config");
        return it->second;
    }
    std::map<std::string, std::vector<long long>> shapes_;

    static int int_field(const Json& cfg, const char* key, int fallback) {
        const Json* v = cfg.get(key);
        if (!v) return fallback;
        if (!v->is_int()) throw ModelError(std::string("config field '") + key + "' is not an integer");
        return static_cast<int>(v->integer);
    }

    void load(const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        if (!f) throw ModelError("cannot open weights file '" + path + "'");
        f.seekg(0, std::ios::end);
        const size_t size = static_cast<size_t>(f.tellg());
        f.seekg(0);
        blob_.resize(size);
        f.read(blob_.data(), static_cast<std::streamsize>(size));
        if (size < 8) throw ModelError("'" + path + "' is not a safetensors file (shorter than 8 bytes)");
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(blob_[i]);
        if (hlen > size - 8) throw ModelError("'" + path + "': the safetensors header length runs past the file");
        Json header;
        try {
            header = parse_json(std::string(blob_.data() + 8, hlen));
        } catch (const JsonError& e) {
            throw ModelError("'" + path + "': safetensors header is not JSON: " + e.what());
        }
        const size_t data_start = 8 + hlen;
        const Json* meta = header.get("__metadata__");
        if (!meta || !meta->get("config") || meta->get("config")->kind != Json::String)
            throw ModelError("'" + path + "' has no __metadata__.config (write it with specproof native export-weights)");
        if (const Json* fmt = meta->get("format"); !fmt || fmt->str != "specproof-weights/1")
            throw ModelError("'" + path + "': __metadata__.format is not specproof-weights/1");
        if (const Json* spec = meta->get("model"); spec && spec->kind == Json::String) model_spec = spec->str;
        Json cj = parse_json(meta->get("config")->str);
        Config& c = cfg;
        c.vocab_size = int_field(cj, "vocab_size", c.vocab_size);
        c.d_model = int_field(cj, "d_model", c.d_model);
        c.n_heads = int_field(cj, "n_heads", c.n_heads);
        c.n_kv_heads = int_field(cj, "n_kv_heads", c.n_kv_heads);
        c.head_dim = int_field(cj, "head_dim", c.head_dim);
        c.ffn_dim = int_field(cj, "ffn_dim", c.ffn_dim);
        c.conv_kernel = int_field(cj, "conv_kernel", c.conv_kernel);
        c.max_context = int_field(cj, "max_context", c.max_context);
        c.gdn_heads = int_field(cj, "gdn_heads", c.gdn_heads);
        c.gdn_key_dim = int_field(cj, "gdn_key_dim", c.gdn_key_dim);
        c.gdn_value_dim = int_field(cj, "gdn_value_dim", c.gdn_value_dim);
        if (const Json* v = cj.get("rope_theta")) c.rope_theta = v->number;
        if (const Json* v = cj.get("norm_eps")) c.norm_eps = v->number;
        if (const Json* v = cj.get("tie_embeddings")) c.tie_embeddings = v->boolean;
        if (const Json* v = cj.get("n_experts"); v && v->integer != 0)
            throw ModelError("config: mixture-of-experts feed-forwards are not supported (n_experts != 0)");
        const Json* layers = cj.get("layers");
        if (!layers || layers->kind != Json::Array || layers->items.empty())
            throw ModelError("config: 'layers' must be a non-empty list of block kinds");
        for (const Json& l : layers->items) {
            if (l.str != "conv" && l.str != "attn")
                throw ModelError("config: block kind '" + l.str + "' is not supported (this engine runs conv and attn blocks only)");
            c.layers.push_back(l.str);
        }
        if (c.n_heads % c.n_kv_heads || c.head_dim % 2 || c.conv_kernel < 2)
            throw ModelError("config: n_kv_heads must divide n_heads, head_dim must be even, conv_kernel >= 2");
        for (const auto& kv : header.fields) {
            if (kv.first == "__metadata__") continue;
            const Json& t = kv.second;
            const Json* dtype = t.get("dtype");
            const Json* shape = t.get("shape");
            const Json* offs = t.get("data_offsets");
            if (!dtype || dtype->str != "F32") throw ModelError("tensor '" + kv.first + "' is not F32");
            if (!shape || !offs || offs->items.size() != 2) throw ModelError("tensor '" + kv.first + "' has a malformed entry");
            std::vector<long long> sh;
            long long count = 1;
            for (const Json& s : shape->items) {
                sh.push_back(s.integer);
                count *= s.integer;
            }
            long long b0 = offs->items[0].integer, b1 = offs->items[1].integer;
            if (b1 - b0 != count * 4 || data_start + static_cast<size_t>(b1) > size || (data_start + b0) % 4)
                throw ModelError("tensor '" + kv.first + "' has data offsets that do not fit its shape or the file");
            tensors_[kv.first] = reinterpret_cast<const float*>(blob_.data() + data_start + b0);
            shapes_[kv.first] = sh;
        }
        build();
    }

    void build() {
        const Config& c = cfg;
        const long long d = c.d_model, L = c.conv_kernel, f = c.ffn_dim, hd = c.head_dim;
        const long long nh = c.n_heads, nkv = c.n_kv_heads, V = c.vocab_size;
        embed_ = tensor("model.embed_tokens.weight", {V, d});
        final_norm_ = tensor("model.embedding_norm.weight", {d});
        head_ = c.tie_embeddings ? embed_ : tensor("lm_head.weight", {V, d});
        for (size_t i = 0; i < c.layers.size(); ++i) {
            const std::string p = "model.layers." + std::to_string(i) + ".";
            Block b;
            b.op_norm = tensor(p + "operator_norm.weight", {d});
            b.ffn_norm = tensor(p + "ffn_norm.weight", {d});
            if (c.layers[i] == "conv") {
                b.slot = n_conv++;
                b.in_proj = tensor(p + "conv.in_proj.weight", {3 * d, d});
                const float* k = tensor(p + "conv.conv.weight", {d, 1, L});
                b.kernel.resize(static_cast<size_t>(L * d));
                for (long long ch = 0; ch < d; ++ch)
                    for (long long tap = 0; tap < L; ++tap) b.kernel[tap * d + ch] = k[ch * L + tap];
                b.out_proj = tensor(p + "conv.out_proj.weight", {d, d});
            } else {
                b.attn = true;
                b.slot = n_attn++;
                const std::string a = p + "self_attn.";
                const float* wq = tensor(a + "q_proj.weight", {nh * hd, d});
                const float* wk = tensor(a + "k_proj.weight", {nkv * hd, d});
                const float* wv = tensor(a + "v_proj.weight", {nkv * hd, d});
                b.qkv.insert(b.qkv.end(), wq, wq + nh * hd * d);
                b.qkv.insert(b.qkv.end(), wk, wk + nkv * hd * d);
                b.qkv.insert(b.qkv.end(), wv, wv + nkv * hd * d);
                b.out_proj = tensor(a + "out_proj.weight", {d, nh * hd});
                b.q_norm = tensor(a + "q_layernorm.weight", {hd});
                b.k_norm = tensor(a + "k_layernorm.weight", {hd});
            }
            const float* w1 = tensor(p + "feed_forward.w1.weight", {f, d});
            const float* w3 = tensor(p + "feed_forward.w3.weight", {f, d});
            b.w13.insert(b.w13.end(), w1, w1 + f * d);
            b.w13.insert(b.w13.end(), w3, w3 + f * d);
            b.w2 = tensor(p + "feed_forward.w2.weight", {d, f});
            blocks_.push_back(std::move(b));
        }
        // RoPE tables, computed in double and stored in float32 as the reference does
        const int half = c.head_dim / 2;
        cos_.resize(static_cast<size_t>(c.max_context) * c.head_dim);
        sin_signed_.resize(cos_.size());
        for (int pos = 0; pos < c.max_context; ++pos)
            for (int i = 0; i < c.head_dim; ++i) {
                const int fi = i % half;
                const double inv = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * fi) / c.head_dim);
                const double ang = static_cast<double>(pos) * inv;
                cos_[static_cast<size_t>(pos) * c.head_dim + i] = static_cast<float>(std::cos(ang));
                const double s = std::sin(ang);
                sin_signed_[static_cast<size_t>(pos) * c.head_dim + i] = static_cast<float>(i < half ? -s : s);
            }
        key_cache.assign(static_cast<size_t>(n_attn) * c.n_kv_heads * c.max_context * c.head_dim, 0.0f);
        value_cache.assign(key_cache.size(), 0.0f);
        conv_state.assign(static_cast<size_t>(n_conv) * (c.conv_kernel - 1) * c.d_model, 0.0f);
    }
};

}  // namespace sp
