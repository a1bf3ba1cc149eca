#!/usr/bin/python3
"""Float64 reference forward pass for glm5_next: GLM-5 with Kimi Delta Attention layers.

glm5_next is a hybrid. Each decoder layer's mixer is either Kimi Delta Attention (KDA, a gated
delta rule with a per-channel decay; "linear_attention") or GLM-5's MLA with its DSA indexer
("full_attention"). The MLPs/MoE, embeddings, head and MTP layer are GLM-5's, except that
config.json's swiglu_limit L > 0 clamps the SwiGLU of every MoE expert (routed and shared):
down(silu(min(gate, L)) * clamp(up, -L, L)); dense MLPs are never clamped. Apart from KDA and
that clamp, everything is deepseek_reference.py's glm_moe_dsa code, imported from it. KDA is written here
from the architecture in tests/reference/README.md ("glm5_next"), independently of the
engine. Everything runs in torch.float64.

    glm5_next_reference.py --model DIR --tokens 1,5,7 --out FILE [--dense_window N]
                           [--kda_chunk C] [--dump_topk FILE]
                           [--mtp_out FILE] [--mtp_draft K --mtp_next S [--mtp_draft_out FILE]]

deepseek_reference.py forwards a glm5_next checkpoint here with the same arguments. The
outputs are deepseek_reference.py's: teacher-forced logits of every position, raw
little-endian float64 [T][vocab_size]. --kda_chunk C > 0 computes every KDA layer in the
chunked (WY / UT transform) form, over chunks aligned to absolute positions 0, C, 2C, ...;
0 (the default) uses the per-token recurrence. The two agree to about 1e-14 in float64.

config.json's hc_mult n > 1 turns on manifold-constrained hyper-connections (mHC, as in
DeepSeek-V4): the residual stream is n streams [n, hidden] per position instead of one. Each
sub-block (the mixer, then the MLP/MoE) reads a weighted sum of the streams and writes its
output back into every stream, which are also mixed by a Sinkhorn-normalised n x n matrix;
the head collapses the streams into one before model.norm. The weights of all three are
computed per position from the streams themselves (hc_mix, hc_head). The main model's logits
work with n > 1; its MTP layer (--mtp_out, --mtp_draft) is refused.

config.json's index_kpool P > 1 (GLM-5.3-Flash) pools the DSA indexer's keys: positions
jP..jP+P-1 form pool j, whose key is a per-dimension softmax-weighted sum of its positions'
keys (weights from index_kpool_compress_gate and index_kpool_compress_ape). Past the dense
window a query attends to the index_topk / P complete pools with the best pooled scores,
whole, plus the positions after its last complete pool (the tail). --dump_topk lists those
positions as it does the unpooled selection.
"""

import json
import math
import os
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_reference as ds  # noqa: E402

MODEL_TYPE = "glm5_next"
LAYER_TYPES = ("linear_attention", "full_attention")
# GLM-5.2 index sharing; not part of glm5_next (every full_attention layer runs its own indexer).
SHARING_KEYS = ("indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")

# q and k of each KDA head are scaled by 1/sqrt(sum(x^2) + L2_NORM_EPS).
L2_NORM_EPS = 1e-6


# ---------------------------------------------------------------- Kimi Delta Attention


def causal_conv(u, weight, conv_state):
    """Depthwise causal convolution, before the SiLU.

    u [T, C] holds the pre-conv inputs of T consecutive positions. weight [C, K]. conv_state
    [K-1, C] holds the pre-conv inputs of the K-1 positions before them, oldest first, and is
    zero before position 0. Output: y[t][c] = sum_j weight[c, j] * u[t - (K-1) + j][c], which
    is PyTorch's Conv1d(groups=C) with K-1 zeros of left padding. Returns y [T, C] and the
    state after the last position: its last K-1 pre-conv inputs."""
    taps = weight.shape[-1]
    tokens = u.shape[0]
    padded = torch.cat((conv_state, u), 0)  # row r is position r - (K-1) relative to u's first
    y = torch.zeros_like(u)
    for j in range(taps):
        y = y + padded[j : j + tokens] * weight[:, j]
    return y, padded[padded.shape[0] - (taps - 1) :].clone()


def l2_normalize(x):
    """x / sqrt(sum(x^2) + 1e-6) over the last axis (one KDA head)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_NORM_EPS)


def softplus(z):
    """log(1 + exp(z)), exactly (no linear cut-off above 20 as torch's softplus has)."""
    return torch.logaddexp(z, torch.zeros_like(z))


def kda_gate(raw, a_log, lower_bound):
    """Log decay g [..., H, D] (the decay factor of key channel d is exp(g)).

    raw = f_b_proj(f_a_proj(x)) + dt_bias, split into heads; a_log [H].
    Without a lower bound: g = -exp(A_log[h]) * softplus(raw), in (-inf, 0).
    With lower bound lb < 0: g = lb * sigmoid(exp(A_log[h]) * raw), in (lb, 0)."""
    a = a_log.exp()[:, None]
    if lower_bound is None:
        return -a * softplus(raw)
    return lower_bound * torch.sigmoid(a * raw)


def kda_recurrent(q, k, v, g, beta, state):
    """The gated delta rule one position at a time.

    q, k [T, H, Dk] (L2-normalised), v [T, H, Dv], g [T, H, Dk] (log decay), beta [T, H],
    state [H, Dk, Dv] before the first position (indexed [key dim][value dim]). Per position:
        S' = diag(exp(g_t)) S
        S  = S' + beta_t k_t (v_t - S'^T k_t)^T
        o_t = S^T (q_t * Dk^-0.5)
    Returns o [T, H, Dv] and the state after the last position."""
    tokens, heads, key_dim = q.shape
    q = q * key_dim**-0.5
    alpha = g.exp()
    s = state.clone()
    out = torch.empty(tokens, heads, v.shape[-1], dtype=torch.float64)
    for t in range(tokens):
        s = s * alpha[t][:, :, None]  # row i (key channel i) scaled by alpha_t[i]
        predicted = torch.einsum("hkv,hk->hv", s, k[t])
        s = s + beta[t][:, None, None] * k[t][:, :, None] * (v[t] - predicted)[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", s, q[t])
    return out, s


def kda_chunk(q, k, v, g, beta, state):
    """One chunk of n positions in the chunkwise (WY / UT transform) form, from `state`.

    Shapes as kda_recurrent; q is already scaled. With G_r = g_1 + ... + g_r (positions of
    the chunk, cumulative, per key channel), the recurrence unrolls to
        S_r = diag(exp(G_r)) S_0 + sum_{i<=r} diag(exp(G_r - G_i)) k_i u_i^T,
    where u_r = beta_r (v_r - S'_r^T k_r) is the "pseudo-value" the delta rule writes. Putting
    the unrolled S'_r into u_r gives a unit lower-triangular system for all u of the chunk:
        u_r + beta_r sum_{i<r} A_ri u_i = beta_r (v_r - S_0^T (exp(G_r) * k_r)),
        A_ri = sum_d k_r[d] k_i[d] exp(G_r[d] - G_i[d])            (i < r),
    so with the UT transform T = (I + diag(beta) A)^-1:
        W = T diag(beta) (exp(G) * K),   U = T diag(beta) V - W S_0,
        O = (exp(G) * Q) S_0 + P U,     P_ri = sum_d q_r[d] k_i[d] exp(G_r[d] - G_i[d]) (i <= r),
        S_n = diag(exp(G_n)) S_0 + (exp(G_n - G) * K)^T U.
    Decays between positions are formed as exp of differences, masked to 0 above the diagonal
    before the exp, so nothing overflows. Returns o [n, H, Dv] and S_n."""
    n, heads, _ = q.shape
    cumulative = g.cumsum(0)  # [n, H, Dk]
    difference = cumulative[:, None] - cumulative[None, :]  # [r, i, H, Dk]: log decay after i through r
    position = torch.arange(n)
    inclusive = (position[None, :] <= position[:, None])[:, :, None, None]
    strict = (position[None, :] < position[:, None])[:, :, None, None]
    decay_inclusive = difference.masked_fill(~inclusive, -math.inf).exp()
    decay_strict = difference.masked_fill(~strict, -math.inf).exp()
    beta_h = beta.T[:, :, None]  # [H, n, 1]: row r scaled by beta_r
    a = torch.einsum("rhd,ihd,rihd->hri", k, k, decay_strict) * beta_h
    identity = torch.eye(n, dtype=torch.float64).expand(heads, n, n)
    ut = torch.linalg.solve_triangular(identity + a, identity, upper=False, unitriangular=True)
    from_start = cumulative.exp()  # [n, H, Dk]: decay from the chunk's start through r
    w = ut @ (beta_h * (from_start * k).transpose(0, 1))  # [H, n, Dk]
    u = ut @ (beta_h * v.transpose(0, 1)) - w @ state  # [H, n, Dv]
    p = torch.einsum("rhd,ihd,rihd->hri", q, k, decay_inclusive)
    out = (from_start * q).transpose(0, 1) @ state + p @ u  # [H, n, Dv]
    to_end = (cumulative[-1][None] - cumulative).exp()  # [n, H, Dk]: decay after i through n
    new_state = cumulative[-1].exp()[:, :, None] * state + torch.einsum("ihd,hiv->hdv", k * to_end, u)
    return out.transpose(0, 1), new_state


def kda_chunked(q, k, v, g, beta, state, chunk, start=0):
    """kda_recurrent's result computed chunk by chunk. The first of the T positions is the
    absolute position `start`; chunks are aligned to absolute multiples of `chunk`, so a
    sequence resumed at position p first finishes the chunk that p falls in."""
    if chunk < 1:
        raise ValueError("chunk must be at least 1")
    tokens, _, key_dim = q.shape
    q = q * key_dim**-0.5
    out = torch.empty(tokens, q.shape[1], v.shape[-1], dtype=torch.float64)
    s = state.clone()
    first = 0
    while first < tokens:
        stop = min(tokens, first + chunk - (start + first) % chunk)
        out[first:stop], s = kda_chunk(q[first:stop], k[first:stop], v[first:stop], g[first:stop], beta[first:stop], s)
        first = stop
    return out, s


def zero_kda_state(config):
    """The KDA state before position 0: conv states of q, k, v ([K-1, H*D] each: the pre-conv
    inputs of the K-1 previous positions, oldest first) and the recurrent state S [H, D, D]."""
    channels = config.linear_num_heads * config.linear_head_dim
    conv = torch.zeros(config.linear_conv_kernel_dim - 1, channels, dtype=torch.float64)
    return {
        "q": conv.clone(),
        "k": conv.clone(),
        "v": conv.clone(),
        "S": torch.zeros(config.linear_num_heads, config.linear_head_dim, config.linear_head_dim, dtype=torch.float64),
    }


# ---------------------------------------------------------------- hyper-connections (mHC)


def hc_sinkhorn(logits, iters, eps):
    """The residual mixing matrix C [..., n, n] (C[a][b]: how much of stream a goes to stream b)
    from its logits M [..., n, n]: a softmax over b of each row a, plus eps, then alternate
    normalisations that make C approximately doubly stochastic, each dividing by (sum + eps):
    columns (sums over a) first, then iters - 1 rounds of rows (sums over b) and columns. The
    last step normalises columns, so a column sums to S / (S + eps), 1 up to about eps (S its
    sum before that step); rows only converge towards 1 as iters grows."""
    c = torch.softmax(logits, -1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def hc_normalized(x, rms_eps):
    """The streams x [T, n, D] of each position flattened stream-major (flat[h*D + d] = x[h][d])
    and divided by their RMS: r / sqrt(mean(r^2) + rms_eps), with no weight."""
    r = x.reshape(x.shape[0], -1)
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + rms_eps)


def hc_mix(x, fn, base, scale, iters, eps, rms_eps):
    """One sub-block's hyper-connection weights from the streams x [T, n, D] of each position.
    fn [(2+n)*n, n*D], base [(2+n)*n], scale [3]. With mixes = fn @ hc_normalized(x):
        pre_i  = sigmoid(mixes[i] * scale[0] + base[i]) + eps                   (i < n)
        post_i = 2 sigmoid(mixes[n+i] * scale[1] + base[n+i])
        C      = hc_sinkhorn(M), M[a][b] = mixes[2n + a*n + b] * scale[2] + base[2n + a*n + b]
    Returns pre [T, n], post [T, n] and C [T, n, n] (C[t][a][b])."""
    n = x.shape[1]
    mixes = hc_normalized(x, rms_eps) @ fn.T  # [T, (2+n)*n]
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(mixes[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    comb_logits = (mixes[:, 2 * n :] * scale[2] + base[2 * n :]).view(-1, n, n)
    return pre, post, hc_sinkhorn(comb_logits, iters, eps)


def hc_collapse(x, weights):
    """The sub-block's input y [T, D] = sum_i weights[t][i] * x[t][i]."""
    return torch.einsum("tn,tnd->td", weights, x)


def hc_expand(x, out, post, comb):
    """The streams after a sub-block with output out [T, D]:
    x_new[b] = post_b * out + sum_a C[a][b] * x[a]."""
    return post[:, :, None] * out[:, None, :] + torch.einsum("tab,tad->tbd", comb, x)


def hc_head(x, fn, base, scale, eps, rms_eps):
    """The single stream [T, D] the final norm and lm_head see: sum_i w_i x[i], with
    w_i = sigmoid(hm[i] * scale[0] + base[i]) + eps, hm = fn @ hc_normalized(x); fn [n, n*D],
    base [n], scale [1]."""
    weights = torch.sigmoid((hc_normalized(x, rms_eps) @ fn.T) * scale[0] + base) + eps
    return hc_collapse(x, weights)


# ---------------------------------------------------------------- pooled indexer keys (index_kpool)


def kpool_keys(keys, gate, ape):
    """The pooled indexer keys [T // P, I] of the complete pools among T positions.

    keys [T, I] are the indexer's keys k_t (wk, k_norm, RoPE: the unpooled indexer's), gate
    [T, I] the gate logits g_t, ape [P, I] one bias per offset in a pool. Pool j covers positions
    jP..jP+P-1 and its key is, per dimension d,
        pk_j[d] = sum_m a_{j,m}[d] k_{jP+m}[d],   a_{j,.}[d] = softmax over m of (g_{jP+m}[d] + ape[m][d]),
    a convex combination of the pool's keys weighed separately in every dimension. Positions
    after the last complete pool belong to no pool."""
    pool, dim = ape.shape
    pools = keys.shape[0] // pool
    span = pools * pool
    weights = torch.softmax(gate[:span].view(pools, pool, dim) + ape, dim=1)  # over the offset m
    return (weights * keys[:span].view(pools, pool, dim)).sum(1)


def kpool_positions(pool_scores, position, pool, topk):
    """The key positions, ascending, that query `position` attends to when the pooled indexer
    selects for it. Its complete pools are j = 0..C-1 with C = (position + 1) // pool (pool j's
    last position jP+P-1 is at most `position`); pool_scores holds at least C scores, and those
    of later pools (not complete yet, so holding future positions) are ignored. The topk / pool
    best complete pools (equal scores: the lower pool, as top_keys) give all P of their
    positions, and the tail C*P..position, the 0 to P-1 positions in no complete pool, is
    always attended: at most topk + pool - 1 positions. A query that completes a pool has no
    tail, so it sees itself only when its own pool is chosen."""
    complete = (position + 1) // pool
    chosen = ds.top_keys(pool_scores[:complete], topk // pool)
    members = (chosen[:, None] * pool + torch.arange(pool)).flatten()
    return torch.cat((members, torch.arange(complete * pool, position + 1)))


# ---------------------------------------------------------------- config


def parse_swiglu_limit(raw):
    """config.json's swiglu_limit as a float L > 0, or None for no clamp (absent, null, 0 or
    false). Anything else (negative, NaN, true, a string) is refused."""
    limit = raw.get("swiglu_limit")
    if limit is None or limit is False:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0:  # true, text, < 0, NaN
        raise SystemExit(
            f"glm5_next: swiglu_limit {limit!r} must be a positive number (the clamp of the MoE "
            "experts' SwiGLU), or absent/null/0/false for no clamp"
        )
    return float(limit) if limit > 0 else None


def swiglu(gate, up, limit=None):
    """silu(gate) * up; with a limit L: silu(min(gate, L)) * clamp(up, -L, L)."""
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
    return torch.nn.functional.silu(gate) * up


# hc_mult's accepted range, as the engine's config parser takes it: the streams multiply the
# residual state n-fold, and mHC models use a handful of streams (4 in the mHC paper).
HC_MULT_MAX = 16


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def parse_hyper_connections(raw):
    """(hc_mult, hc_sinkhorn_iters, hc_eps) from config.json. hc_mult absent, null or 1: a plain
    residual stream, and the other two keys are not looked at (that model never uses them).
    Otherwise hc_mult is an integer in [1, 16], hc_sinkhorn_iters an integer >= 1 (absent or
    null: 20), hc_eps a finite float > 0 (absent or null: 1e-6)."""
    n = raw.get("hc_mult")
    if n is None:
        return 1, 20, 1e-6
    if not _is_int(n) or not 1 <= n <= HC_MULT_MAX:
        raise SystemExit(
            f"glm5_next: hc_mult {n!r} must be an integer from 1 (no hyper-connections) to {HC_MULT_MAX}"
        )
    if n == 1:
        return 1, 20, 1e-6
    iters = raw.get("hc_sinkhorn_iters")
    iters = 20 if iters is None else iters
    if not _is_int(iters) or iters < 1:
        raise SystemExit(f"glm5_next: hc_sinkhorn_iters {iters!r} must be an integer >= 1")
    eps = raw.get("hc_eps")
    eps = 1e-6 if eps is None else eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:  # also NaN
        raise SystemExit(f"glm5_next: hc_eps {eps!r} must be a positive number")
    return n, iters, float(eps)


# index_kpool's accepted range: a pool is a few consecutive positions; a larger value is far
# more likely a mistyped config than a model, so it is refused rather than trusted.
INDEX_KPOOL_MAX = 64

# With index_kpool > 1 these must be true (absent or null counts as true): the published model
# only defines pools that are compressed by the gate and ape and a tail that is always attended.
INDEX_KPOOL_REQUIRED_TRUE = ("index_kpool_always_select_tail", "index_kpool_compress")


def parse_index_kpool(raw):
    """The indexer's pool length P from config.json's index_kpool: 1 (no pooling, the plain
    indexer) for absent, null, 0, 1 or false; otherwise an integer in [2, 64] dividing
    index_topk (the indexer then picks index_topk / P whole pools). A bool true, a float or
    another non-integer is refused, as are the required-true keys set to anything but true.
    With P = 1 those keys are not looked at (that model never uses them)."""
    pool = raw.get("index_kpool")
    if pool is None or pool is False or (_is_int(pool) and pool in (0, 1)):
        return 1
    if not _is_int(pool) or not 1 < pool <= INDEX_KPOOL_MAX:
        raise SystemExit(
            f"glm5_next: index_kpool {pool!r} must be an integer from 2 to {INDEX_KPOOL_MAX} (the pool "
            "length of the indexer's pooled keys), or absent/null/0/1/false for no pooling"
        )
    topk = raw.get("index_topk") or 0  # no indexer: nothing to pool, any P divides 0
    if topk % pool:
        raise SystemExit(
            f"glm5_next: index_kpool {pool} does not divide index_topk {topk}: the pooled indexer "
            "selects index_topk / index_kpool whole pools"
        )
    for key in INDEX_KPOOL_REQUIRED_TRUE:
        value = raw.get(key)
        if value is not None and value is not True:
            raise SystemExit(
                f"glm5_next: {key} {value!r} with index_kpool {pool}: only true (or absent) is "
                "implemented, the form the published model defines"
            )
    return pool


class Config(ds.Config):
    """glm_moe_dsa's config (parsed by deepseek_reference.Config with GLM-5's defaults) plus
    layer_types, the KDA keys, swiglu_limit, the hyper-connection keys and index_kpool."""

    def __init__(self, raw):
        if raw.get("model_type") != MODEL_TYPE:
            raise SystemExit(
                f"model_type {raw.get('model_type')!r}: glm5_next_reference.py reads glm5_next "
                "(deepseek_reference.py reads deepseek_v3, deepseek_v32 and glm_moe_dsa)"
            )
        # Pooled indexer keys: P positions per pool; 1 is the plain indexer.
        self.index_kpool = parse_index_kpool(raw)
        layers = raw["num_hidden_layers"]
        types = raw.get("layer_types")
        if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
            raise SystemExit(f"layer_types {types!r}: one of {LAYER_TYPES} for each of the {layers} layers")
        self.layer_types = list(types)
        self.linear_num_heads = int(raw["linear_num_heads"])
        self.linear_head_dim = int(raw["linear_head_dim"])
        kernel = raw.get("linear_conv_kernel_dim")
        self.linear_conv_kernel_dim = 4 if kernel is None else int(kernel)
        if self.linear_conv_kernel_dim < 1:
            raise SystemExit(f"linear_conv_kernel_dim {kernel!r} must be at least 1")
        lower_bound = raw.get("linear_lower_bound")
        if lower_bound is not None:
            lower_bound = float(lower_bound)
            if not lower_bound < 0:
                raise SystemExit(f"linear_lower_bound {lower_bound!r} must be negative (or null)")
        self.linear_lower_bound = lower_bound
        # Clamped SwiGLU in the MLPs of MoE layers (routed and shared experts); None: no clamp.
        self.swiglu_limit = parse_swiglu_limit(raw)
        # Hyper-connections: hc_mult residual streams; 1 is the plain residual.
        self.hc_mult, self.hc_sinkhorn_iters, self.hc_eps = parse_hyper_connections(raw)
        # Everything else is glm_moe_dsa's, with its defaults (indexer RoPE interleaved).
        super().__init__(dict(raw, model_type="glm_moe_dsa"))
        self.model_type = MODEL_TYPE

    def _parse_indexer(self, raw):
        # Called by ds.Config.__init__. No index_topk (or 0): no indexer anywhere. Otherwise every
        # full_attention layer runs its own; GLM-5.2's index sharing is not part of glm5_next.
        if not raw.get("index_topk"):
            self.has_indexer = False
            return
        super()._parse_indexer({key: value for key, value in raw.items() if key not in SHARING_KEYS})
        # A config may still carry GLM-5.2's sharing keys; refuse one that would make a
        # full_attention layer "shared" (what the schedule says for linear layers is moot).
        schedule = raw.get("indexer_types")
        if schedule is None and raw.get("index_topk_pattern") is not None:
            schedule = [{"F": "full", "S": "shared"}.get(c, c) for c in raw["index_topk_pattern"]]
        if schedule is None:
            freq = max(raw.get("index_topk_freq") or 1, 1)
            offset = raw.get("index_skip_topk_offset")
            offset = 2 if offset is None else offset
            schedule = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(self.num_layers)]
        shared = [
            i
            for i, t in enumerate(self.layer_types)
            if t == "full_attention" and i < len(schedule) and schedule[i] == "shared"
        ]
        if shared:
            raise SystemExit(
                f"glm5_next: the index-sharing keys make full_attention layers {shared} 'shared'; "
                "glm5_next runs an indexer in every full_attention layer"
            )
        self.indexer_types = ["full" if t == "full_attention" else "none" for t in self.layer_types]

    def layer_type(self, layer):
        """"linear_attention" or "full_attention"; the MTP layer (index num_layers) is full."""
        return self.layer_types[layer] if layer < self.num_layers else "full_attention"

    def indexer_type(self, layer):
        """"full" for a full_attention layer (MTP included) when the model has an indexer,
        "none" otherwise."""
        return "full" if self.has_indexer and self.layer_type(layer) == "full_attention" else "none"


# ---------------------------------------------------------------- forward pass


class Reference(ds.Reference):
    """deepseek_reference.Reference with KDA mixers in the linear_attention layers.
    kda_chunk 0: recurrent form; C > 0: chunked form over chunks of C positions."""

    def __init__(self, config, checkpoint, dense_window=2051, attention="plain", kda_chunk=0):
        super().__init__(config, checkpoint, dense_window, attention)
        if kda_chunk < 0:
            raise SystemExit("--kda_chunk must be 0 (recurrent) or a chunk length")
        self.kda_chunk = kda_chunk
        self._active_swiglu_limit = None  # config.swiglu_limit while a MoE layer runs

    # ------------------------------------------------------------ hyper-connections

    def hc_weights(self, prefix):
        """(fn, base, scale) of one hyper-connection as float64: prefix "model.layers.{i}.hc_attn"
        or "...hc_ffn" ([(2+n)*n, n*D], [(2+n)*n], [3]) or "model.hc_head" ([n, n*D], [n], [1]).
        A shape other than those is refused: fn's flattening order cannot be guessed."""
        n, hidden = self.config.hc_mult, self.config.hidden_size
        rows, scales = (n, 1) if prefix == "model.hc_head" else ((2 + n) * n, 3)
        expected = {"_fn": [rows, n * hidden], "_base": [rows], "_scale": [scales]}
        tensors = []
        for suffix, shape in expected.items():
            value = self._weight(prefix + suffix)
            if list(value.shape) != shape:
                raise SystemExit(f"{prefix}{suffix}: shape {list(value.shape)}, expected {shape} (hc_mult {n})")
            tensors.append(value)
        return tensors

    def _hc_mix(self, prefix, x):
        config = self.config
        fn, base, scale = self.hc_weights(prefix)
        return hc_mix(x, fn, base, scale, config.hc_sinkhorn_iters, config.hc_eps, config.rms_norm_eps)

    def hidden_states(self, tokens):
        """As deepseek_reference's; with hc_mult n > 1 the embedding starts n equal streams
        [T, n, hidden], the layers update all of them, and hc_head (or, without model.hc_head_*
        tensors, their mean) collapses them into the one stream model.norm sees."""
        config = self.config
        if config.hc_mult == 1:
            return super().hidden_states(tokens)
        embedded = self._weight(self._embedding_and_head()[0])[torch.tensor(tokens, dtype=torch.long)]
        streams = embedded[:, None, :].expand(-1, config.hc_mult, -1).clone()
        cos, sin = ds.rope_tables(config, len(tokens))
        selection = None
        selections = []
        for layer in range(config.num_layers):
            streams, selection = self._decoder_layer(layer, streams, cos, sin, selection)
            selections.append(selection[1])
        if "model.hc_head_fn" in self.checkpoint:
            # DeepSeek-V4's head: learned stream weights.
            fn, base, scale = self.hc_weights("model.hc_head")
            hidden = hc_head(streams, fn, base, scale, config.hc_eps, config.rms_norm_eps)
        else:
            # GLM-5.3-Flash's checkpoints carry no hc_head tensors: the head reads the plain
            # mean of the streams.
            hidden = streams.mean(dim=1)
        return ds.rms_norm(hidden, self._weight("model.norm.weight"), config.rms_norm_eps), selections

    def _decoder_layer(self, layer, hidden, cos, sin, previous_selection):
        """deepseek_reference's layer; with hc_mult n > 1, `hidden` is the streams [T, n, hidden]
        and each sub-block, with its own norm as before, sees hc_collapse of them and is written
        back by hc_expand instead of being added to one residual stream."""
        config = self.config
        if config.hc_mult == 1:
            return super()._decoder_layer(layer, hidden, cos, sin, previous_selection)
        prefix = f"model.layers.{layer}."
        eps = config.rms_norm_eps
        pre, post, comb = self._hc_mix(prefix + "hc_attn", hidden)
        x = ds.rms_norm(hc_collapse(hidden, pre), self._weight(prefix + "input_layernorm.weight"), eps)
        attention_out, selection = self._attention(layer, x, cos, sin, previous_selection)
        hidden = hc_expand(hidden, attention_out, post, comb)
        pre, post, comb = self._hc_mix(prefix + "hc_ffn", hidden)
        x = ds.rms_norm(hc_collapse(hidden, pre), self._weight(prefix + "post_attention_layernorm.weight"), eps)
        if config.mlp_type(layer) == "sparse":
            mlp_out = self._moe(prefix + "mlp", x)
        else:
            mlp_out = self._mlp(prefix + "mlp", x)
        return hc_expand(hidden, mlp_out, post, comb), selection

    # ------------------------------------------------------------ MTP

    def _mtp_prefix(self):
        # The MTP layer of a hyper-connection model would need its own stream handling (what it
        # is fed, whether it has hc tensors), which no spec here defines: refuse rather than guess.
        # Only the MTP entry points come here; the main model's logits never do.
        config = self.config
        if config.hc_mult > 1 and config.num_nextn_predict_layers:
            raise SystemExit(
                f"glm5_next: MTP (num_nextn_predict_layers {config.num_nextn_predict_layers}) with hc_mult "
                f"{config.hc_mult} (hyper-connections) is not implemented: drop --mtp_out / --mtp_draft "
                "(the main model's logits are implemented)"
            )
        return super()._mtp_prefix()

    def mtp_forward(self, tokens):
        if self.config.hc_mult > 1:
            self._mtp_prefix()  # refuse before the main-model pass, not after it
        return super().mtp_forward(tokens)

    def mtp_draft_steps(self, tokens, next_token, k):
        if self.config.hc_mult > 1:
            self._mtp_prefix()
        return super().mtp_draft_steps(tokens, next_token, k)

    # ------------------------------------------------------------ pooled indexer (index_kpool)

    def kpool_weights(self, layer):
        """The pooling tensors of a layer's indexer (the MTP layer's included) as float64:
        index_kpool_compress_gate [I, hidden], which maps the indexer's input x (what wk reads)
        to the gate logits g = gate @ x, and index_kpool_compress_ape [P, I]. A wrong shape is
        refused by name: a transposed gate or ape would otherwise broadcast or mis-index."""
        config = self.config
        prefix = f"model.layers.{layer}.self_attn.indexer."
        expected = {
            "index_kpool_compress_gate": [config.index_head_dim, config.hidden_size],
            "index_kpool_compress_ape": [config.index_kpool, config.index_head_dim],
        }
        tensors = []
        for name, shape in expected.items():
            value = self._weight(prefix + name)
            if list(value.shape) != shape:
                raise SystemExit(
                    f"{prefix}{name}: shape {list(value.shape)}, expected {shape} "
                    f"(index_kpool {config.index_kpool}, index_head_dim {config.index_head_dim})"
                )
            tensors.append(value)
        return tensors

    def kpool_indexer_scores(self, layer, x, q_latent, cos, sin, first):
        """The pooled keys [T // P, I] of a layer's indexer over the whole sequence and the
        pooled scores [T - first, T // P] of queries first..T-1 against them: the unpooled
        indexer's score (deepseek_reference's _indexer_scores) with pool j's key in place of a
        position's key,
            score(s, j) = sum_h w_h(s) * n_heads^-0.5 * relu(q_h(s) . pk_j) * I^-0.5.
        k_t, q_h(s) and w_h(s) are the unpooled indexer's: wk, LayerNorm k_norm and RoPE on the
        first qk_rope_head_dim dims (rotating each position before pooling); wq_b of the q
        latent, rotated the same way; weights_proj."""
        config = self.config
        prefix = f"model.layers.{layer}.self_attn.indexer."
        heads, head_dim, rope = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
        interleave = config.indexer_rope_interleave
        keys = ds.layer_norm(
            self._linear(prefix + "wk", x),
            self._weight(prefix + "k_norm.weight"),
            self._weight(prefix + "k_norm.bias"),
            ds.INDEXER_NORM_EPS,
        )
        keys = torch.cat((ds.apply_rope(keys[:, :rope], cos, sin, interleave), keys[:, rope:]), -1)
        gate, ape = self.kpool_weights(layer)
        pooled = kpool_keys(keys, x @ gate.T, ape)
        q = self._linear(prefix + "wq_b", q_latent[first:]).view(-1, heads, head_dim)
        q = torch.cat((ds.apply_rope(q[..., :rope], cos[first:], sin[first:], interleave), q[..., rope:]), -1)
        head_weights = self._linear(prefix + "weights_proj", x[first:]) * heads**-0.5
        out = torch.empty(q.shape[0], pooled.shape[0], dtype=torch.float64)
        step = ds._row_block(heads, pooled.shape[0])
        for start in range(0, q.shape[0], step):
            stop = min(q.shape[0], start + step)
            per_head = torch.einsum("shd,jd->shj", q[start:stop], pooled).clamp_min(0) * head_dim**-0.5
            out[start:stop] = torch.einsum("shj,sh->sj", per_head, head_weights[start:stop])
        return pooled, out

    def _select(self, layer, x, q_latent, cos, sin, previous_selection):
        """deepseek_reference's selection, and with index_kpool P > 1 the pooled one: a query s
        with s + 1 <= dense_window attends to all its causal keys (and when the whole sequence
        fits the window no indexer runs), a later one to kpool_positions of its pooled scores:
        the index_topk / P best complete pools, whole, plus its tail."""
        config = self.config
        tokens = x.shape[0]
        pool, topk = config.index_kpool, getattr(config, "index_topk", 0)
        if pool == 1 or not config.has_indexer or tokens <= self.dense_window:
            return super()._select(layer, x, q_latent, cos, sin, previous_selection)
        if topk % pool:  # Config refuses this; a caller that changes index_topk afterwards is not
            raise SystemExit(f"glm5_next: index_kpool {pool} does not divide index_topk {topk}")
        first = self.dense_window  # first query position with more causal keys than the window
        _, scores = self.kpool_indexer_scores(layer, x, q_latent, cos, sin, first)
        allowed = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        dump = {}
        for position in range(first, tokens):
            chosen = kpool_positions(scores[position - first], position, pool, topk)
            allowed[position] = False
            allowed[position, chosen] = True
            dump[position] = chosen.tolist()
        return allowed, dump

    # ------------------------------------------------------------ mixers

    def _attention(self, layer, x, cos, sin, previous_selection):
        if self.config.layer_type(layer) == "full_attention":
            return super()._attention(layer, x, cos, sin, previous_selection)
        out, _ = self.kda_mixer(layer, x)
        return out, (None, {})  # no key selection in a linear layer

    def _moe(self, prefix, x):
        # deepseek_reference's routing and expert sum; every MLP it runs (routed experts and
        # shared experts) is clamped by swiglu_limit. Dense-layer MLPs come through _mlp alone.
        self._active_swiglu_limit = self.config.swiglu_limit
        try:
            return super()._moe(prefix, x)
        finally:
            self._active_swiglu_limit = None

    def _mlp(self, prefix, x):
        gate = self._linear(prefix + ".gate_proj", x)
        up = self._linear(prefix + ".up_proj", x)
        return self._linear(prefix + ".down_proj", swiglu(gate, up, self._active_swiglu_limit))

    def kda_weights(self, layer):
        """A linear_attention layer's non-projection tensors as float64, in the shapes used
        here: conv weights [H*D, K], A_log [H], dt_bias [H, D], o_norm [D]."""
        config = self.config
        heads, head_dim, taps = config.linear_num_heads, config.linear_head_dim, config.linear_conv_kernel_dim
        prefix = f"model.layers.{layer}.self_attn."
        weights = {}
        for name in ("q", "k", "v"):
            conv = self._weight(prefix + f"{name}_conv1d.weight")
            if conv.numel() != heads * head_dim * taps or conv.shape[0] != heads * head_dim or conv.shape[-1] != taps:
                expected = [heads * head_dim, 1, taps]
                raise SystemExit(f"{prefix}{name}_conv1d.weight: shape {list(conv.shape)}, expected {expected}")
            weights[name] = conv.reshape(heads * head_dim, taps)
        a_log = self._weight(prefix + "A_log")
        if a_log.numel() != heads:  # stored as [H] or [1, 1, H, 1]
            raise SystemExit(f"{prefix}A_log: shape {list(a_log.shape)}, expected {heads} elements")
        weights["A_log"] = a_log.reshape(heads)
        dt_bias = self._weight(prefix + "dt_bias")
        if dt_bias.numel() != heads * head_dim:
            raise SystemExit(f"{prefix}dt_bias: shape {list(dt_bias.shape)}, expected [{heads * head_dim}]")
        weights["dt_bias"] = dt_bias.reshape(heads, head_dim)
        weights["o_norm"] = self._weight(prefix + "o_norm.weight")
        return weights

    def kda_mixer(self, layer, x, state=None, start=0, chunk=None):
        """Kimi Delta Attention of model.layers.{layer} over x = input_layernorm(h) [T, hidden]
        at absolute positions start..start+T-1, from `state` (zero_kda_state() when None: the
        sequence starts at `start`). chunk: None for this Reference's kda_chunk, 0 for the
        recurrence, C for chunks of C aligned to absolute multiples of C.
        Returns the mixer output [T, hidden] and the state after the last position."""
        config = self.config
        heads, head_dim = config.linear_num_heads, config.linear_head_dim
        prefix = f"model.layers.{layer}.self_attn."
        tokens = x.shape[0]
        state = zero_kda_state(config) if state is None else state
        chunk = self.kda_chunk if chunk is None else chunk
        weights = self.kda_weights(layer)
        new_state = {}
        streams = {}
        for name in ("q", "k", "v"):
            u = self._linear(prefix + f"{name}_proj", x)
            y, new_state[name] = causal_conv(u, weights[name], state[name])
            streams[name] = torch.nn.functional.silu(y).view(tokens, heads, head_dim)
        q, k, v = l2_normalize(streams["q"]), l2_normalize(streams["k"]), streams["v"]
        raw = self._linear(prefix + "f_b_proj", self._linear(prefix + "f_a_proj", x)).view(tokens, heads, head_dim)
        g = kda_gate(raw + weights["dt_bias"], weights["A_log"], config.linear_lower_bound)
        beta = torch.sigmoid(self._linear(prefix + "b_proj", x))  # [T, H]
        if chunk:
            out, new_state["S"] = kda_chunked(q, k, v, g, beta, state["S"], chunk, start)
        else:
            out, new_state["S"] = kda_recurrent(q, k, v, g, beta, state["S"])
        gate = self._linear(prefix + "g_b_proj", self._linear(prefix + "g_a_proj", x)).view(tokens, heads, head_dim)
        out = ds.rms_norm(out, weights["o_norm"], config.rms_norm_eps) * torch.sigmoid(gate)
        return self._linear(prefix + "o_proj", out.reshape(tokens, heads * head_dim)), new_state


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = Config(json.load(f))
    return config, ds.Checkpoint(model_dir, config.weight_block_size)


def main(argv=None):
    parser = ds.build_parser(__doc__)
    parser.add_argument(
        "--kda_chunk",
        type=int,
        default=0,
        metavar="C",
        help="compute KDA layers in chunks of C positions aligned to multiples of C (default 0: recurrent)",
    )
    args = parser.parse_args(argv)
    if args.kda_chunk < 0:
        parser.error("--kda_chunk must be 0 (recurrent) or a chunk length")
    config, checkpoint = load(args.model)
    reference = Reference(config, checkpoint, args.dense_window, kda_chunk=args.kda_chunk)
    return ds.run_cli(args, config, checkpoint, reference)


if __name__ == "__main__":
    sys.exit(main())
