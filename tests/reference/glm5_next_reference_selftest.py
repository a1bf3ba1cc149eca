#!/usr/bin/python3
"""Self-test of glm5_next_reference.py (Kimi Delta Attention + GLM-5 MLA hybrid), a few seconds.

Writes tiny random glm5_next checkpoints with its own safetensors writer (F32; BF16 with
linear_lower_bound and A_log stored as [1, 1, H, 1]; FP8 block-scaled linears over two shards
with an MTP layer; F32 with qk_rope_head_dim 0; hyper-connections with hc_mult 4 (F32) and 2
(BF16, two shards, an MTP layer); pooled indexer keys with index_kpool 2 (F32) and 4 (FP8,
NoPE, two shards, an MTP layer)). Checks a hand-computed KDA step, a scalar
re-implementation of a whole KDA mixer (both gates), the causal conv convention, chunked ==
recurrent, resuming from a (conv state, S) checkpoint, causality, that a wrong conv tap order
or a missing L2 norm changes the logits, NoPE MLA and indexer, swiglu_limit's clamped SwiGLU
(a hand-computed MoE layer; MoE layers and the MTP layer clamped, dense layers not; 1e9 ==
no limit), hyper-connections (Sinkhorn sums, a hand-computed sub-block, the degenerate
uniform case, layer and head wiring against plain Python with stub mixers, prefill ==
position-by-position decode, hc tensors that move the logits, MTP refused), index_kpool (a
hand-computed pooled indexer against plain Python, the selection rule on given scores and on
every selection the models make, prefill == decode, gate and ape entries that move the
logits only past the dense window, the MTP layer's own tensors), the config rules, and the
command line (also through deepseek_reference.py).
Exits 0 when everything passes; the last line is 'N passed, M failed'.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
sys.path.insert(0, HERE)
import deepseek_reference as ds  # noqa: E402
import deepseek_reference_selftest as ds_test  # noqa: E402  (its safetensors / FP8 writer)
import glm5_next_reference as ref  # noqa: E402

TOKENS = [3, 17, 42, 5, 9, 63, 0, 28, 28, 11, 50, 7, 33, 19]
VOCAB = 64

BASE_CONFIG = {
    "model_type": "glm5_next",
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "vocab_size": VOCAB,
    "rms_norm_eps": 1e-5,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 3,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "mlp_layer_types": ["dense", "sparse", "dense", "sparse"],
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
    "rope_interleave": True,
    "indexer_rope_interleave": True,
    "index_topk": 5,
    "index_n_heads": 3,
    "index_head_dim": 16,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "linear_num_heads": 2,
    "linear_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}


def f32_config():
    return dict(BASE_CONFIG)


def bf16_lb_config():
    config = dict(
        BASE_CONFIG,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_conv_kernel_dim=3,
        linear_lower_bound=-2.0,
        first_k_dense_replace=1,
    )
    del config["mlp_layer_types"]
    return config


def fp8_config():
    return dict(
        BASE_CONFIG,
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 8]},
        num_nextn_predict_layers=1,
        linear_lower_bound=None,
    )


def nope_config():
    return dict(
        BASE_CONFIG,
        qk_rope_head_dim=0,
        layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_conv_kernel_dim=2,
    )


def hc4_config():
    """Four hyper-connection streams, hc_sinkhorn_iters and hc_eps left to their defaults."""
    return dict(BASE_CONFIG, hc_mult=4)


def hc2_mtp_config():
    """Two streams with explicit Sinkhorn keys, and an MTP layer (which the reference refuses
    to run for a hyper-connection model, while the main model's logits work)."""
    return dict(
        BASE_CONFIG,
        hc_mult=2,
        hc_sinkhorn_iters=7,
        hc_eps=1e-5,
        num_nextn_predict_layers=1,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
    )


def kpool2_config():
    """Pooled indexer keys, P = 2, on the f32 model (layers linear, full, linear, full; indexer
    RoPE on 8 of its 16 dims): index_topk 4 picks 2 pools of the complete ones."""
    return dict(BASE_CONFIG, index_kpool=2, index_topk=4)


def kpool4_mtp_config():
    """P = 4 (index_topk 4: one pool) with FP8 linears (the gate included), NoPE, an MTP layer
    and the two required keys spelled out."""
    return dict(
        fp8_config(),
        qk_rope_head_dim=0,
        layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_conv_kernel_dim=2,
        index_topk=4,
        index_kpool=4,
        index_kpool_always_select_tail=True,
        index_kpool_compress=True,
    )


# ---------------------------------------------------------------- tiny checkpoints


def make_checkpoint(directory, raw_config, seed, linear_dtype, norm_dtype, shards=1, a_log_4d=False):
    """Random glm5_next weights. linear_dtype "F8_E4M3" stores every projection (KDA ones
    included) as FP8 + scale_inv; the router gate, indexer weights_proj, embeddings, head and
    the KDA conv / A_log / dt_bias / o_norm tensors stay BF16 or F32."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(raw_config, f, indent=1)
    config = ref.Config(raw_config)
    rng = np.random.default_rng(seed)
    block = config.weight_block_size
    tensors = {}
    small_dtype = "F32" if linear_dtype == "F32" else "BF16"

    def linear(name, rows, cols, quantizable=True):
        weight = rng.standard_normal((rows, cols)) / math.sqrt(cols)
        if linear_dtype == "F8_E4M3" and quantizable:
            codes, scale = ds_test.quantize_fp8(weight, block)
            tensors[name + ".weight"] = ("F8_E4M3", codes)
            tensors[name + ".weight_scale_inv"] = ("F32", scale)
        else:
            tensors[name + ".weight"] = (small_dtype, weight)

    def norm(name, size, dtype=None):
        tensors[name] = (dtype or norm_dtype, 1.0 + 0.1 * rng.standard_normal(size))

    def mlp(prefix, inner):
        linear(prefix + ".gate_proj", inner, config.hidden_size)
        linear(prefix + ".up_proj", inner, config.hidden_size)
        linear(prefix + ".down_proj", config.hidden_size, inner)

    hidden, heads = config.hidden_size, config.num_heads
    qk_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    lin_heads, lin_dim, taps = config.linear_num_heads, config.linear_head_dim, config.linear_conv_kernel_dim
    channels = lin_heads * lin_dim
    tensors["model.embed_tokens.weight"] = ("BF16", rng.standard_normal((config.vocab_size, hidden)))
    tensors["lm_head.weight"] = ("BF16", rng.standard_normal((config.vocab_size, hidden)) / math.sqrt(hidden))
    norm("model.norm.weight", hidden)
    for layer in range(config.num_layers + config.num_nextn_predict_layers):
        p = f"model.layers.{layer}."
        norm(p + "input_layernorm.weight", hidden)
        norm(p + "post_attention_layernorm.weight", hidden)
        a = p + "self_attn."
        if config.layer_type(layer) == "linear_attention":
            for name in ("q", "k", "v"):
                linear(a + f"{name}_proj", channels, hidden)
                tensors[a + f"{name}_conv1d.weight"] = (small_dtype, 0.6 * rng.standard_normal((channels, 1, taps)))
            a_log = rng.uniform(-1.5, 0.5, lin_heads)
            tensors[a + "A_log"] = ("F32", a_log.reshape(1, 1, lin_heads, 1) if a_log_4d else a_log)
            tensors[a + "dt_bias"] = ("F32", -1.0 + 0.5 * rng.standard_normal(channels))
            linear(a + "f_a_proj", lin_dim, hidden)
            linear(a + "f_b_proj", channels, lin_dim)
            linear(a + "b_proj", lin_heads, hidden)
            linear(a + "g_a_proj", lin_dim, hidden)
            linear(a + "g_b_proj", channels, lin_dim)
            norm(a + "o_norm.weight", lin_dim)
            linear(a + "o_proj", hidden, channels)
        else:
            linear(a + "q_a_proj", config.q_lora_rank, hidden)
            norm(a + "q_a_layernorm.weight", config.q_lora_rank)
            linear(a + "q_b_proj", heads * qk_dim, config.q_lora_rank)
            linear(a + "kv_a_proj_with_mqa", config.kv_lora_rank + config.qk_rope_head_dim, hidden)
            norm(a + "kv_a_layernorm.weight", config.kv_lora_rank)
            linear(a + "kv_b_proj", heads * (config.qk_nope_head_dim + config.v_head_dim), config.kv_lora_rank)
            linear(a + "o_proj", hidden, heads * config.v_head_dim)
            if config.indexer_type(layer) == "full":
                i = a + "indexer."
                linear(i + "wq_b", config.index_n_heads * config.index_head_dim, config.q_lora_rank)
                linear(i + "wk", config.index_head_dim, hidden)
                norm(i + "k_norm.weight", config.index_head_dim, "F32")
                tensors[i + "k_norm.bias"] = ("F32", 0.1 * rng.standard_normal(config.index_head_dim))
                linear(i + "weights_proj", config.index_n_heads, hidden, quantizable=False)
        m = p + "mlp"
        if config.mlp_type(layer) == "dense":
            mlp(m, config.intermediate_size)
        else:
            linear(m + ".gate", config.n_routed_experts, hidden, quantizable=False)
            tensors[m + ".gate.e_score_correction_bias"] = ("F32", 0.05 * rng.standard_normal(config.n_routed_experts))
            for expert in range(config.n_routed_experts):
                mlp(f"{m}.experts.{expert}", config.moe_intermediate_size)
            mlp(m + ".shared_experts", config.moe_intermediate_size * config.n_shared_experts)
    if config.num_nextn_predict_layers:
        p = f"model.layers.{config.num_layers}."
        norm(p + "enorm.weight", hidden)
        norm(p + "hnorm.weight", hidden)
        linear(p + "eh_proj", hidden, 2 * hidden)
        norm(p + "shared_head.norm.weight", hidden)
        head = rng.standard_normal((config.vocab_size, hidden)) / math.sqrt(hidden)
        tensors[p + "shared_head.head.weight"] = ("BF16", head)
    if config.hc_mult > 1:
        # Written last, so the other tensors of a seed are those of a model without them. fn
        # scaled so each mix is about N(0, 1) for normalised streams; scales and bases of order 1
        # so that pre, post and C all vary between positions. fn in the small dtype (BF16 or
        # F32), base and scale always F32: the reference converts whatever is stored.
        n = config.hc_mult

        def hc(prefix, rows, scales):
            tensors[prefix + "_fn"] = (small_dtype, rng.standard_normal((rows, n * hidden)) / math.sqrt(n * hidden))
            tensors[prefix + "_base"] = ("F32", 0.5 * rng.standard_normal(rows))
            tensors[prefix + "_scale"] = ("F32", rng.uniform(0.5, 1.5, scales))

        for layer in range(config.num_layers):
            hc(f"model.layers.{layer}.hc_attn", (2 + n) * n, 3)
            hc(f"model.layers.{layer}.hc_ffn", (2 + n) * n, 3)
        hc("model.hc_head", n, 1)
    if config.index_kpool > 1:
        # Also last: a pooled model's other tensors are those of the same seed without pooling.
        # The gate scaled like a linear (logits of order 1) and ape of order 1, so the pool
        # weights vary with the position, the offset and the dimension.
        pool, dim = config.index_kpool, config.index_head_dim
        for layer in range(config.num_layers + config.num_nextn_predict_layers):
            if config.indexer_type(layer) != "full":
                continue
            i = f"model.layers.{layer}.self_attn.indexer."
            gate = rng.standard_normal((dim, hidden)) / math.sqrt(hidden)
            if linear_dtype == "F8_E4M3":
                codes, scale = ds_test.quantize_fp8(gate, block)
                tensors[i + "index_kpool_compress_gate"] = ("F8_E4M3", codes)
                tensors[i + "index_kpool_compress_gate_scale_inv"] = ("F32", scale)
            else:
                tensors[i + "index_kpool_compress_gate"] = (small_dtype, gate)
            tensors[i + "index_kpool_compress_ape"] = ("F32", rng.standard_normal((pool, dim)))

    names = list(tensors)
    if shards == 1:
        ds_test.write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
        return
    weight_map = {}
    for shard in range(shards):
        file_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        ds_test.write_safetensors(os.path.join(directory, file_name), {n: tensors[n] for n in part})
        weight_map.update({n: file_name for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def _model_dirs(tmp):
    dirs = {name: os.path.join(tmp, name) for name in ("f32", "bf16_lb", "fp8", "nope", "hc4", "hc2_mtp")}
    if not os.path.exists(dirs["f32"]):
        make_checkpoint(dirs["f32"], f32_config(), 20, "F32", "F32")
        make_checkpoint(dirs["bf16_lb"], bf16_lb_config(), 21, "BF16", "BF16", a_log_4d=True)
        make_checkpoint(dirs["fp8"], fp8_config(), 22, "F8_E4M3", "BF16", shards=2)
        make_checkpoint(dirs["nope"], nope_config(), 23, "F32", "F32")
        make_checkpoint(dirs["hc4"], hc4_config(), 25, "F32", "F32")
        make_checkpoint(dirs["hc2_mtp"], hc2_mtp_config(), 26, "BF16", "BF16", shards=2)
    return dirs


def _kpool_dirs(tmp):
    """The pooled-indexer checkpoints, apart from _model_dirs: the tests that run every model
    there (chunked == recurrent) have nothing to learn from them."""
    dirs = {name: os.path.join(tmp, name) for name in ("kpool2", "kpool4_mtp")}
    if not os.path.exists(dirs["kpool2"]):
        make_checkpoint(dirs["kpool2"], kpool2_config(), 20, "F32", "F32")  # f32's seed
        make_checkpoint(dirs["kpool4_mtp"], kpool4_mtp_config(), 27, "F8_E4M3", "BF16", shards=2)
    return dirs


# ---------------------------------------------------------------- helpers


def reference(model_dir, dense_window=2051, attention="plain", kda_chunk=0, index_topk=None):
    config, checkpoint = ref.load(model_dir)
    if index_topk is not None:
        config.index_topk = index_topk
    return ref.Reference(config, checkpoint, dense_window, attention, kda_chunk)


def run(model_dir, tokens=TOKENS, **kwargs):
    with torch.no_grad():
        return reference(model_dir, **kwargs).forward(tokens)


def max_diff(a, b):
    return float((a - b).abs().max())


def layer_input(r, tokens, layer):
    """input_layernorm(h) of `layer` for the sequence (what its mixer sees)."""
    config = r.config
    hidden = r._weight(r._embedding_and_head()[0])[torch.tensor(tokens, dtype=torch.long)]
    cos, sin = ds.rope_tables(config, len(tokens))
    selection = None
    for i in range(layer):
        hidden, selection = r._decoder_layer(i, hidden, cos, sin, selection)
    return ds.rms_norm(hidden, r._weight(f"model.layers.{layer}.input_layernorm.weight"), config.rms_norm_eps)


class DictCheckpoint:
    """An in-memory stand-in for ds.Checkpoint: name -> float64 tensor."""

    def __init__(self, tensors):
        self.entries = {n: torch.tensor(v, dtype=torch.float64) for n, v in tensors.items()}

    def __contains__(self, name):
        return name in self.entries

    def get(self, name):
        return self.entries[name]


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def silu(z):
    return z * sigmoid(z)


def matvec(matrix, vector):
    return [sum(a * b for a, b in zip(row, vector)) for row in matrix]


# ---------------------------------------------------------------- tests


def test_hand_kda_steps(_):
    """Two steps of one head (D = 2) worked out by hand; q and k given already normalised.

    Step 1, S0 = [[1, 2], [3, 4]], alpha = (1/2, 1/4), k = (0.6, 0.8), v = (1, -1), beta = 1/2:
      S'      = [[0.5, 1], [0.75, 1]]            (row i times alpha[i])
      S'^T k  = (0.5*0.6 + 0.75*0.8, 1*0.6 + 1*0.8) = (0.9, 1.4)
      beta (v - S'^T k) = 0.5 * (0.1, -2.4) = (0.05, -1.2)
      S1      = S' + k (0.05, -1.2) = [[0.53, 0.28], [0.79, 0.04]]
      o1      = S1^T q / sqrt(2) with q = (1, 0): (0.53, 0.28) / sqrt(2)
    Step 2, alpha = (1, 1/2), k = (0, 1), v = (2, 0), beta = 1, q = (0, 1):
      S'      = [[0.53, 0.28], [0.395, 0.02]]
      S'^T k  = (0.395, 0.02); beta (v - S'^T k) = (1.605, -0.02)
      S2      = [[0.53, 0.28], [2, 0]]           (row 1 becomes v exactly)
      o2      = (2, 0) / sqrt(2)
    """

    def t(values):
        return torch.tensor(values, dtype=torch.float64)

    q = t([[[1.0, 0.0]], [[0.0, 1.0]]])
    k = t([[[0.6, 0.8]], [[0.0, 1.0]]])
    v = t([[[1.0, -1.0]], [[2.0, 0.0]]])
    g = t([[[0.5, 0.25]], [[1.0, 0.5]]]).log()
    beta = t([[0.5], [1.0]])
    s0 = t([[[1.0, 2.0], [3.0, 4.0]]])
    want_out = t([[[0.53, 0.28]], [[2.0, 0.0]]]) / math.sqrt(2)
    want_s1 = t([[[0.53, 0.28], [0.79, 0.04]]])
    want_s2 = t([[[0.53, 0.28], [2.0, 0.0]]])
    out, s = ref.kda_recurrent(q[:1], k[:1], v[:1], g[:1], beta[:1], s0)
    assert max_diff(out, want_out[:1]) < 1e-15 and max_diff(s, want_s1) < 1e-15, (out, s)
    out, s = ref.kda_recurrent(q, k, v, g, beta, s0)
    assert max_diff(out, want_out) < 1e-15 and max_diff(s, want_s2) < 1e-15, (out, s)
    for chunk, start in ((1, 0), (2, 0), (2, 1), (3, 0), (5, 4)):
        out, s = ref.kda_chunked(q, k, v, g, beta, s0, chunk, start)
        assert max_diff(out, want_out) < 1e-14 and max_diff(s, want_s2) < 1e-14, (chunk, start, out, s)


def test_causal_conv(_):
    """Tap j of K multiplies the input K-1-j positions back (PyTorch Conv1d, left padding K-1)."""
    u = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    w = torch.tensor([[10.0, 100.0, 1000.0]], dtype=torch.float64)
    y, state = ref.causal_conv(u, w, torch.zeros(2, 1, dtype=torch.float64))
    assert y[:, 0].tolist() == [1000.0, 2100.0, 3210.0] and state[:, 0].tolist() == [2.0, 3.0], (y, state)
    # From a state: the K-1 previous inputs, oldest first; a single position shifts it by one.
    y, state = ref.causal_conv(u[:1] * 7, w, torch.tensor([[5.0], [6.0]], dtype=torch.float64))
    assert y[:, 0].tolist() == [7650.0] and state[:, 0].tolist() == [6.0, 7.0], (y, state)
    y, state = ref.causal_conv(u, w[:, :1], torch.zeros(0, 1, dtype=torch.float64))  # K = 1
    assert y[:, 0].tolist() == [10.0, 20.0, 30.0] and state.shape == (0, 1)
    rng = np.random.default_rng(3)
    u = torch.from_numpy(rng.standard_normal((9, 5)))
    w = torch.from_numpy(rng.standard_normal((5, 4)))
    torch_conv = torch.nn.functional.conv1d(u.T[None], w[:, None, :], padding=3, groups=5)[0, :, :9].T
    y, _ = ref.causal_conv(u, w, torch.zeros(3, 5, dtype=torch.float64))
    assert max_diff(y, torch_conv) < 1e-14


def test_gate_formulas(_):
    raw = torch.tensor([[[-3.0, 0.0, 2.0], [30.0, -30.0, 0.5]]], dtype=torch.float64)  # [1, H=2, D=3]
    a_log = torch.tensor([0.3, -1.2], dtype=torch.float64)
    plain = ref.kda_gate(raw, a_log, None)
    bounded = ref.kda_gate(raw, a_log, -2.0)
    for h in range(2):
        a = math.exp(float(a_log[h]))
        for d in range(3):
            z = float(raw[0, h, d])
            assert abs(float(plain[0, h, d]) - -a * math.log1p(math.exp(z))) < 1e-13, (h, d)
            assert abs(float(bounded[0, h, d]) - -2.0 * sigmoid(a * z)) < 1e-15, (h, d)
    assert (plain < 0).all() and (bounded < 0).all() and (bounded > -2.0).all()
    # softplus is exact above torch's linear cut-off at 20: softplus(30) = 30 + 9.4e-14.
    assert float(ref.softplus(torch.tensor(30.0, dtype=torch.float64))) == math.log1p(math.exp(30.0))


def _scalar_mixer(weights, xs, heads, head_dim, taps, eps, lower_bound, flip_taps=False, l2=True):
    """A KDA mixer over the rows xs in plain Python floats, written from the spec."""
    tokens, channels = len(xs), heads * head_dim
    streams = {}
    for name in ("q", "k", "v"):
        u = [matvec(weights[f"{name}_proj"], x) for x in xs]
        w = [row[0][::-1] if flip_taps else row[0] for row in weights[f"{name}_conv1d"]]
        streams[name] = [
            [
                silu(sum(w[c][j] * u[t - (taps - 1) + j][c] for j in range(taps) if t - (taps - 1) + j >= 0))
                for c in range(channels)
            ]
            for t in range(tokens)
        ]
    state = [[[0.0] * head_dim for _ in range(head_dim)] for _ in range(heads)]
    outputs = []
    for t, x in enumerate(xs):
        raw = [a + b for a, b in zip(matvec(weights["f_b_proj"], matvec(weights["f_a_proj"], x)), weights["dt_bias"])]
        beta = [sigmoid(z) for z in matvec(weights["b_proj"], x)]
        out_gate = matvec(weights["g_b_proj"], matvec(weights["g_a_proj"], x))
        concat = []
        for h in range(heads):
            part = slice(h * head_dim, (h + 1) * head_dim)
            q, k, v = streams["q"][t][part], streams["k"][t][part], streams["v"][t][part]
            if l2:
                q = [e / math.sqrt(sum(f * f for f in q) + 1e-6) for e in q]
                k = [e / math.sqrt(sum(f * f for f in k) + 1e-6) for e in k]
            a = math.exp(weights["A_log"][h])
            if lower_bound is None:
                g = [-a * math.log1p(math.exp(z)) for z in raw[part]]
            else:
                g = [lower_bound * sigmoid(a * z) for z in raw[part]]
            s = state[h]
            for i in range(head_dim):
                s[i] = [e * math.exp(g[i]) for e in s[i]]
            predicted = [sum(s[i][j] * k[i] for i in range(head_dim)) for j in range(head_dim)]
            for i in range(head_dim):
                for j in range(head_dim):
                    s[i][j] += beta[h] * k[i] * (v[j] - predicted[j])
            o = [sum(s[i][j] * q[i] for i in range(head_dim)) / math.sqrt(head_dim) for j in range(head_dim)]
            rms = math.sqrt(sum(e * e for e in o) / head_dim + eps)
            gate = out_gate[part]
            concat += [o[j] / rms * weights["o_norm"][j] * sigmoid(gate[j]) for j in range(head_dim)]
        outputs.append(matvec(weights["o_proj"], concat))
    return outputs


def test_scalar_mixer(_):
    """A whole KDA mixer (H = 2, D = 2, K = 3, hidden 3, five positions, explicit weights) against
    the scalar version above, for both gates and both forms. Also shows the comparison would
    catch reversed conv taps or a missing L2 norm."""
    heads, head_dim, taps, hidden = 2, 2, 3, 3
    channels = heads * head_dim

    def numbers(rows, cols, salt):
        # Small explicit values, different for every tensor: ((5i + 3j + salt) mod 7 - 3) / 4.
        return [[((5 * i + 3 * j + salt) % 7 - 3) / 4 for j in range(cols)] for i in range(rows)]

    weights = {
        "q_proj": numbers(channels, hidden, 1),
        "k_proj": numbers(channels, hidden, 2),
        "v_proj": numbers(channels, hidden, 3),
        "q_conv1d": [[row] for row in numbers(channels, taps, 4)],
        "k_conv1d": [[row] for row in numbers(channels, taps, 5)],
        "v_conv1d": [[row] for row in numbers(channels, taps, 6)],
        "A_log": [0.25, -0.5],
        "dt_bias": [0.5, -1.0, 0.0, 1.5],
        "f_a_proj": numbers(head_dim, hidden, 7),
        "f_b_proj": numbers(channels, head_dim, 8),
        "b_proj": numbers(heads, hidden, 9),
        "g_a_proj": numbers(head_dim, hidden, 10),
        "g_b_proj": numbers(channels, head_dim, 11),
        "o_norm": [1.25, 0.75],
        "o_proj": numbers(hidden, channels, 12),
    }
    xs = [[1.0, -0.5, 0.25], [0.5, 2.0, -1.0], [-1.5, 0.0, 1.0], [0.75, 0.25, 0.5], [2.0, -1.0, -0.25]]
    prefix = "model.layers.0.self_attn."
    stored = {prefix + n + ("" if n in ("A_log", "dt_bias") else ".weight"): v for n, v in weights.items()}
    stored[prefix + "A_log"] = [[weights["A_log"]]]  # [1, 1, H] elements: any shape with H values
    raw_config = dict(BASE_CONFIG, hidden_size=hidden, linear_num_heads=heads, linear_head_dim=head_dim)
    raw_config["linear_conv_kernel_dim"] = taps
    x = f64(xs)
    for lower_bound in (None, -2.0):
        config = ref.Config(dict(raw_config, linear_lower_bound=lower_bound))
        r = ref.Reference(config, DictCheckpoint(stored))
        want = f64(_scalar_mixer(weights, xs, heads, head_dim, taps, config.rms_norm_eps, lower_bound))
        for chunk in (0, 1, 2, 5):
            with torch.no_grad():
                got, _ = r.kda_mixer(0, x, chunk=chunk)
            assert max_diff(got, want) < 1e-13, (lower_bound, chunk, max_diff(got, want))
        flipped = _scalar_mixer(weights, xs, heads, head_dim, taps, config.rms_norm_eps, lower_bound, flip_taps=True)
        unnormed = _scalar_mixer(weights, xs, heads, head_dim, taps, config.rms_norm_eps, lower_bound, l2=False)
        assert max_diff(got, f64(flipped)) > 1e-3 and max_diff(got, f64(unnormed)) > 1e-3
    other_gate = _scalar_mixer(weights, xs, heads, head_dim, taps, config.rms_norm_eps, None)
    assert max_diff(got, f64(other_gate)) > 1e-3


def test_chunked_equals_recurrent(tmp):
    for name, directory in _model_dirs(tmp).items():
        recurrent, _ = run(directory, dense_window=4)
        assert torch.isfinite(recurrent).all(), name
        for chunk in (1, 2, 3, 4, 5, 14, 32):
            chunked, _ = run(directory, dense_window=4, kda_chunk=chunk)
            assert max_diff(recurrent, chunked) < 1e-10, (name, chunk, max_diff(recurrent, chunked))


def test_resume_from_state(tmp):
    """A KDA mixer run over positions 0..p-1, then from its (conv state, S) over p..T-1, gives
    the full run's outputs and final state, whichever form computes each part. The conv
    state at p holds the pre-conv inputs of positions p-K+1..p-1 (zero before 0)."""
    dirs = _model_dirs(tmp)
    for name in ("f32", "bf16_lb"):
        r = reference(dirs[name], dense_window=4)
        config = r.config
        taps = config.linear_conv_kernel_dim
        linear_layers = [i for i, t in enumerate(config.layer_types) if t == "linear_attention"]
        with torch.no_grad():
            for layer in (linear_layers[0], linear_layers[-1]):
                x = layer_input(r, TOKENS, layer)
                full, full_state = r.kda_mixer(layer, x, chunk=0)
                u_q = r._linear(f"model.layers.{layer}.self_attn.q_proj", x)
                for p in (1, 2, 3, 4, 7, 13):
                    for first_chunk, rest_chunk in ((0, 0), (4, 4), (5, 5), (3, 0), (0, 3)):
                        head, state = r.kda_mixer(layer, x[:p], chunk=first_chunk)
                        tail, final = r.kda_mixer(layer, x[p:], state=state, start=p, chunk=rest_chunk)
                        assert max_diff(torch.cat((head, tail)), full) < 1e-10, (name, layer, p, first_chunk)
                        for key in ("q", "k", "v", "S"):
                            assert max_diff(final[key], full_state[key]) < 1e-10, (name, layer, p, key)
                    padded = torch.cat((torch.zeros(taps - 1, u_q.shape[1], dtype=torch.float64), u_q))
                    assert torch.equal(state["q"], padded[p : p + taps - 1]), (name, layer, p)
                # A state that is not zero matters: starting the tail from zeros differs.
                head, state = r.kda_mixer(layer, x[:7])
                tail, _ = r.kda_mixer(layer, x[7:], start=7)
                assert max_diff(tail, full[7:]) > 1e-3, (name, layer)


def test_causality(tmp):
    dirs = _model_dirs(tmp)
    for name in ("f32", "bf16_lb", "nope"):
        for chunk in (0, 4):
            full, _ = run(dirs[name], dense_window=4, kda_chunk=chunk)
            prefix, _ = run(dirs[name], TOKENS[:9], dense_window=4, kda_chunk=chunk)
            assert max_diff(full[:9], prefix) < 1e-10, (name, chunk)


def test_lower_bound_changes_the_gate(tmp):
    directory = _model_dirs(tmp)["bf16_lb"]
    r = reference(directory, dense_window=4)
    assert r.config.linear_lower_bound == -2.0
    with torch.no_grad():
        bounded, _ = r.forward(TOKENS)
        r.config.linear_lower_bound = None  # the same weights with the softplus gate
        unbounded, _ = r.forward(TOKENS)
    assert max_diff(bounded, unbounded) > 1e-3
    raw = dict(bf16_lb_config())
    del raw["linear_lower_bound"]
    assert ref.Config(raw).linear_lower_bound is None
    assert ref.Config(dict(raw, linear_lower_bound=None)).linear_lower_bound is None


def test_mutations_change_logits(tmp):
    """Reversed conv taps, or q and k without the L2 norm, move the logits: the checks above
    can fail."""
    directory = _model_dirs(tmp)["f32"]
    r = reference(directory, dense_window=4)
    with torch.no_grad():
        good, _ = r.forward(TOKENS)
        get = r.checkpoint.get
        r.checkpoint.get = lambda name: get(name).flip(-1) if name.endswith("_conv1d.weight") else get(name)
        flipped, _ = r.forward(TOKENS)
        r.checkpoint.get = get
        normalize = ref.l2_normalize
        ref.l2_normalize = lambda x: x
        try:
            unnormed, _ = r.forward(TOKENS)
        finally:
            ref.l2_normalize = normalize
        again, _ = r.forward(TOKENS)
    assert max_diff(good, flipped) > 1e-3, max_diff(good, flipped)
    assert max_diff(good, unnormed) > 1e-3, max_diff(good, unnormed)
    assert torch.equal(good, again)


def test_sparse_selection(tmp):
    """Full-attention layers select past the window with their own indexer, linear ones none."""
    for name in ("f32", "nope"):
        directory = _model_dirs(tmp)[name]
        dense, dense_dump = run(directory, dense_window=len(TOKENS))
        assert all(selected == {} for selected in dense_dump)
        everything, _ = run(directory, dense_window=0, index_topk=len(TOKENS))
        assert max_diff(dense, everything) < 1e-12, name
        sparse, dump = run(directory, dense_window=4, index_topk=3)
        assert max_diff(dense[:4], sparse[:4]) < 1e-12, name
        assert all(max_diff(dense[p], sparse[p]) > 1e-6 for p in range(5, len(TOKENS))), name
        config, _ = ref.load(directory)
        for layer, selected in enumerate(dump):
            if config.layer_types[layer] == "linear_attention":
                assert selected == {} and config.indexer_type(layer) == "none", (name, layer)
                continue
            assert config.indexer_type(layer) == "full" and sorted(selected) == list(range(4, len(TOKENS)))
            for position, keys in selected.items():
                assert len(keys) == 3 and keys == sorted(keys) and keys[-1] <= position, (layer, position, keys)
        full_layers = [i for i, t in enumerate(config.layer_types) if t == "full_attention"]
        assert dump[full_layers[0]] != dump[full_layers[1]], name  # each runs its own indexer


def test_nope(tmp):
    """qk_rope_head_dim 0: no rotary part in MLA or the indexer. Absorbed == plain, and layer 0's
    selection against a scalar indexer without RoPE (so without positions)."""
    directory = _model_dirs(tmp)["nope"]
    config, checkpoint = ref.load(directory)
    assert config.qk_rope_head_dim == 0 and config.inv_freq.numel() == 0
    assert config.softmax_scale == config.qk_nope_head_dim**-0.5
    plain, dump = run(directory, dense_window=4, index_topk=3)
    absorbed, _ = run(directory, dense_window=4, index_topk=3, attention="absorbed")
    assert torch.isfinite(plain).all() and max_diff(plain, absorbed) < 1e-10
    assert config.layer_types[0] == "full_attention"

    def w(name):
        return checkpoint.get("model.layers.0." + name).tolist()

    def rms(vector, weight, eps):
        scale = 1.0 / math.sqrt(sum(v * v for v in vector) / len(vector) + eps)
        return [v * scale * g for v, g in zip(vector, weight)]

    embedding = checkpoint.get("model.embed_tokens.weight")
    heads, head_dim = config.index_n_heads, config.index_head_dim
    keys, queries = [], []
    for token in TOKENS:
        x = rms(embedding[token].tolist(), w("input_layernorm.weight"), config.rms_norm_eps)
        q_latent = rms(matvec(w("self_attn.q_a_proj.weight"), x), w("self_attn.q_a_layernorm.weight"), 1e-6)
        k = matvec(w("self_attn.indexer.wk.weight"), x)
        mean = sum(k) / len(k)
        var = sum((v - mean) ** 2 for v in k) / len(k)
        gamma, beta = w("self_attn.indexer.k_norm.weight"), w("self_attn.indexer.k_norm.bias")
        keys.append([(v - mean) / math.sqrt(var + 1e-6) * g + b for v, g, b in zip(k, gamma, beta)])
        q_all = matvec(w("self_attn.indexer.wq_b.weight"), q_latent)
        head_weights = matvec(w("self_attn.indexer.weights_proj.weight"), x)
        queries.append([(q_all[h * head_dim : (h + 1) * head_dim], head_weights[h]) for h in range(heads)])
    for p in range(4, len(TOKENS)):
        scores = []
        for t in range(p + 1):
            score = 0.0
            for q, head_weight in queries[p]:
                score += head_weight * max(sum(a * b for a, b in zip(q, keys[t])), 0.0)
            scores.append(score)
        want = sorted(sorted(range(p + 1), key=lambda t: (-scores[t], t))[:3])
        assert dump[0][p] == want, (p, dump[0][p], want)


def test_fp8_and_mtp(tmp):
    """FP8 KDA projections decode with their block scales; the MTP layer (index L) is a full
    attention layer with its own indexer, fed by the hybrid main model."""
    directory = _model_dirs(tmp)["fp8"]
    config, checkpoint = ref.load(directory)
    name = "model.layers.0.self_attn.f_b_proj.weight"
    assert checkpoint.entries[name][1] == "F8_E4M3" and checkpoint.get(name).shape == (16, 8)
    assert config.layer_type(config.num_layers) == "full_attention" and config.indexer_type(config.num_layers) == "full"
    with torch.no_grad():
        r = reference(directory, dense_window=4, index_topk=3)
        mtp, selection = r.mtp_forward(TOKENS)
        chunked = reference(directory, dense_window=4, index_topk=3, kda_chunk=3).mtp_logits(TOKENS)
        main_mtp_dir, _ = r.forward(TOKENS)
    assert mtp.shape == (len(TOKENS) - 1, VOCAB) and torch.isfinite(mtp).all()
    assert max_diff(mtp, chunked) < 1e-10
    assert sorted(selection) == list(range(4, len(TOKENS) - 1))
    assert torch.isfinite(main_mtp_dir).all()


def test_config_rules(tmp):
    config = ref.Config(f32_config())
    assert config.model_type == "glm5_next" and config.has_indexer and config.indexer_rope_interleave
    assert [config.indexer_type(i) for i in range(5)] == ["none", "full", "none", "full", "full"]
    assert config.mlp_layer_types == ["dense", "sparse", "dense", "sparse"]
    assert ref.Config(bf16_lb_config()).mlp_layer_types == ["dense", "sparse", "sparse", "sparse"]
    assert ref.Config(dict(f32_config(), linear_conv_kernel_dim=None)).linear_conv_kernel_dim == 4
    no_index = ref.Config(dict(f32_config(), index_topk=0))
    assert not no_index.has_indexer and no_index.indexer_type(1) == "none"
    # index_kpool: absent, null, 0, 1 or false is the plain indexer (P = 1), and then the two
    # required-true keys are not read; P > 1 divides index_topk and is at most 64.
    assert config.index_kpool == 1
    for off in (None, 0, 1, False):
        no_pool = ref.Config(dict(f32_config(), index_kpool=off, index_kpool_compress=False))
        assert no_pool.index_kpool == 1, off
    assert ref.Config(kpool2_config()).index_kpool == 2
    assert ref.Config(kpool4_mtp_config()).index_kpool == 4
    nulls = dict(kpool2_config(), index_kpool_always_select_tail=None, index_kpool_compress=None)
    assert ref.Config(nulls).index_kpool == 2
    assert ref.Config(dict(f32_config(), index_kpool=64, index_topk=128)).index_kpool == 64
    assert ref.Config(dict(f32_config(), index_kpool=5)).index_kpool == 5  # P == index_topk: one pool
    assert not ref.Config(dict(f32_config(), index_kpool=4, index_topk=0)).has_indexer  # nothing to pool
    # hc_mult: absent, null or 1 is the plain residual, whatever the other hc keys say (they are
    # not read); n > 1 takes hc_sinkhorn_iters (default 20) and hc_eps (default 1e-6).
    for plain in (ref.Config(f32_config()), ref.Config(dict(f32_config(), hc_mult=None))):
        assert (plain.hc_mult, plain.hc_sinkhorn_iters, plain.hc_eps) == (1, 20, 1e-6)
    one = ref.Config(dict(f32_config(), hc_mult=1, hc_sinkhorn_iters=0, hc_eps=-1))
    assert (one.hc_mult, one.hc_sinkhorn_iters, one.hc_eps) == (1, 20, 1e-6)
    four = ref.Config(hc4_config())
    assert (four.hc_mult, four.hc_sinkhorn_iters, four.hc_eps) == (4, 20, 1e-6)
    nulls = ref.Config(dict(hc4_config(), hc_sinkhorn_iters=None, hc_eps=None))
    assert (nulls.hc_sinkhorn_iters, nulls.hc_eps) == (20, 1e-6)
    two = ref.Config(hc2_mtp_config())
    assert (two.hc_mult, two.hc_sinkhorn_iters, two.hc_eps) == (2, 7, 1e-5)
    assert ref.Config(dict(f32_config(), hc_mult=16, hc_sinkhorn_iters=1, hc_eps=2)).hc_eps == 2.0
    # swiglu_limit: absent, null, 0 or false is no clamp; a positive number is the limit.
    assert config.swiglu_limit is None
    for off in (None, 0, 0.0, False):
        assert ref.Config(dict(f32_config(), swiglu_limit=off)).swiglu_limit is None, off
    assert ref.Config(dict(f32_config(), swiglu_limit=7)).swiglu_limit == 7.0
    assert ref.Config(dict(f32_config(), swiglu_limit=0.5)).swiglu_limit == 0.5
    # A sharing schedule that keeps every full_attention layer full is harmless.
    assert ref.Config(dict(f32_config(), indexer_types=["full"] * 4)).indexer_types[1] == "full"
    shares_linear_only = ref.Config(dict(f32_config(), index_topk_freq=2, index_skip_topk_offset=0))
    assert shares_linear_only.indexer_types == ["none", "full", "none", "full"]
    bad = {
        "hc_mult 0 must be an integer": dict(f32_config(), hc_mult=0),
        "hc_mult -2 must be": dict(f32_config(), hc_mult=-2),
        "hc_mult 17 must be": dict(f32_config(), hc_mult=17),
        "hc_mult 2.0 must be": dict(f32_config(), hc_mult=2.0),
        "hc_mult True must be": dict(f32_config(), hc_mult=True),
        "hc_mult '4' must be": dict(f32_config(), hc_mult="4"),
        "hc_sinkhorn_iters 0 must be": dict(f32_config(), hc_mult=2, hc_sinkhorn_iters=0),
        "hc_sinkhorn_iters 2.5 must be": dict(f32_config(), hc_mult=2, hc_sinkhorn_iters=2.5),
        "hc_eps 0 must be a positive number": dict(f32_config(), hc_mult=2, hc_eps=0),
        "hc_eps -1e-06 must be": dict(f32_config(), hc_mult=2, hc_eps=-1e-6),
        "hc_eps nan must be": dict(f32_config(), hc_mult=2, hc_eps=math.nan),
        "hc_eps inf must be": dict(f32_config(), hc_mult=2, hc_eps=math.inf),
        "hc_eps '1e-6' must be": dict(f32_config(), hc_mult=2, hc_eps="1e-6"),
        "index_kpool 4 does not divide index_topk 5": dict(f32_config(), index_kpool=4),
        "index_kpool 2 does not divide index_topk 5": dict(f32_config(), index_kpool=2),
        "index_kpool 128 must be an integer from 2 to 64": dict(f32_config(), index_kpool=128, index_topk=128),
        "index_kpool 65 must be": dict(f32_config(), index_kpool=65, index_topk=130),
        "index_kpool -2 must be": dict(f32_config(), index_kpool=-2),
        "index_kpool 2.0 must be": dict(kpool2_config(), index_kpool=2.0),
        "index_kpool 1.0 must be": dict(f32_config(), index_kpool=1.0),
        "index_kpool True must be": dict(f32_config(), index_kpool=True),
        "index_kpool '2' must be": dict(kpool2_config(), index_kpool="2"),
        "index_kpool_always_select_tail False with index_kpool 2": dict(
            kpool2_config(), index_kpool_always_select_tail=False
        ),
        "index_kpool_compress False with index_kpool 2": dict(kpool2_config(), index_kpool_compress=False),
        "index_kpool_compress 1 with index_kpool 4": dict(kpool4_mtp_config(), index_kpool_compress=1),
        "swiglu_limit -1.0 must be a positive number": dict(f32_config(), swiglu_limit=-1.0),
        "swiglu_limit True": dict(f32_config(), swiglu_limit=True),
        "swiglu_limit '7'": dict(f32_config(), swiglu_limit="7"),
        "swiglu_limit nan": dict(f32_config(), swiglu_limit=math.nan),
        "layer_types": dict(f32_config(), layer_types=["linear_attention"] * 3),
        "'mamba'": dict(f32_config(), layer_types=["mamba"] + ["full_attention"] * 3),
        "must be negative": dict(f32_config(), linear_lower_bound=0.5),
        "layers [1, 3] 'shared'": dict(f32_config(), index_topk_freq=2, index_skip_topk_offset=1),
        "layers [3] 'shared'": dict(f32_config(), index_topk_pattern="FFFS"),
        "glm5_next_reference.py reads glm5_next": dict(f32_config(), model_type="glm_moe_dsa"),
    }
    for needle, raw in bad.items():
        try:
            ref.Config(raw)
        except SystemExit as e:
            assert needle in str(e), (needle, str(e))
        else:
            raise AssertionError(f"config accepted: {needle}")
    # A_log stored as [1, 1, H, 1] (bf16_lb) reads the same as [H].
    r = reference(_model_dirs(tmp)["bf16_lb"])
    assert r.checkpoint.entries["model.layers.0.self_attn.A_log"][2] == [1, 1, 2, 1]
    assert r.kda_weights(0)["A_log"].shape == (2,)


def _with_keys(tmp, name, tag, **keys):
    """A copy of checkpoint `name` whose config.json also says `keys` (same weights, linked,
    not rewritten), in a directory named after `tag`."""
    source = _model_dirs(tmp)[name]
    directory = os.path.join(tmp, f"{name}_{tag}")
    if not os.path.exists(directory):
        os.makedirs(directory)
        with open(os.path.join(source, "config.json")) as f:
            raw = json.load(f)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(dict(raw, **keys), f, indent=1)
        for file_name in os.listdir(source):
            if file_name != "config.json":
                os.symlink(os.path.join(source, file_name), os.path.join(directory, file_name))
    return directory


def _with_limit(tmp, name, limit):
    """A copy of checkpoint `name` whose config.json says swiglu_limit `limit`."""
    return _with_keys(tmp, name, f"limit_{limit}", swiglu_limit=limit)


def test_swiglu_limit_hand_expert(_):
    """One MoE layer (hidden 2, two routed experts of width 2, top-1 greedy, one shared expert)
    with swiglu_limit L = 1 and explicit weights, for the token x = (1, 1), which the router
    sends to expert 0 with weight 1 * routed_scaling_factor (2.5):
      expert 0: gate = (2, -3), up = (3, -2) -> silu(min(gate, 1)) = (silu(1), silu(-3)),
                clamp(up, -1, 1) = (1, -1),
                h = (0.7310585786300049, 0.14227761953270035),
                down [[1, 2], [-1, 0.5]] h = (1.0156138177...,  -0.6599197688...)
      shared:   gate = (0.5, -0.25) (under L), up = (0.5, 1.5) -> (0.5, 1),
                h = (silu(0.5) * 0.5, silu(-0.25) * 1), down = identity
      output = 2.5 * expert 0 + shared.
    Without the limit (and through _mlp, as a dense layer runs it) nothing is clamped."""
    limit = 1.0
    m = "model.layers.0.mlp"
    stored = {
        m + ".gate.weight": [[1.0, 1.0], [-1.0, -1.0]],
        m + ".experts.0.gate_proj.weight": [[2.0, 0.0], [-1.0, -2.0]],
        m + ".experts.0.up_proj.weight": [[1.0, 2.0], [-1.0, -1.0]],
        m + ".experts.0.down_proj.weight": [[1.0, 2.0], [-1.0, 0.5]],
        m + ".experts.1.gate_proj.weight": [[5.0, 5.0], [5.0, 5.0]],
        m + ".experts.1.up_proj.weight": [[5.0, 5.0], [5.0, 5.0]],
        m + ".experts.1.down_proj.weight": [[5.0, 5.0], [5.0, 5.0]],
        m + ".shared_experts.gate_proj.weight": [[0.25, 0.25], [0.0, -0.25]],
        m + ".shared_experts.up_proj.weight": [[0.25, 0.25], [1.0, 0.5]],
        m + ".shared_experts.down_proj.weight": [[1.0, 0.0], [0.0, 1.0]],
    }
    raw = dict(
        BASE_CONFIG,
        hidden_size=2,
        moe_intermediate_size=2,
        n_routed_experts=2,
        num_experts_per_tok=1,
        n_shared_experts=1,
        topk_method="greedy",
        mlp_layer_types=["sparse"] * 4,
        swiglu_limit=limit,
    )
    config = ref.Config(raw)
    assert config.swiglu_limit == 1.0 and config.routed_scaling_factor == 2.5
    r = ref.Reference(config, DictCheckpoint(stored))
    x = f64([[1.0, 1.0]])
    h = [silu(1.0) * 1.0, silu(-3.0) * -1.0]
    assert abs(h[0] - 0.7310585786300049) < 1e-15 and abs(h[1] - 0.14227761953270035) < 1e-15
    expert = [h[0] + 2.0 * h[1], -h[0] + 0.5 * h[1]]
    assert abs(expert[0] - 1.0156138177) < 1e-10 and abs(expert[1] - -0.6599197688) < 1e-10
    shared = [silu(0.5) * 0.5, silu(-0.25) * 1.0]
    want = [2.5 * e + s for e, s in zip(expert, shared)]
    with torch.no_grad():
        got = r._moe(m, x)
        expert_alone = r._mlp(m + ".experts.0", x)  # outside a MoE layer: no clamp
    assert max_diff(got, f64([want])) < 1e-14, (got, want)
    unclamped = [silu(2.0) * 3.0, silu(-3.0) * -2.0]
    want_alone = [unclamped[0] + 2.0 * unclamped[1], -unclamped[0] + 0.5 * unclamped[1]]
    assert max_diff(expert_alone, f64([want_alone])) < 1e-14, (expert_alone, want_alone)
    # The same layer without the key: every expert unclamped.
    r = ref.Reference(ref.Config(dict(raw, swiglu_limit=None)), DictCheckpoint(stored))
    shared_unclamped = [silu(0.5) * 0.5, silu(-0.25) * 1.5]
    want = [2.5 * e + s for e, s in zip(want_alone, shared_unclamped)]
    with torch.no_grad():
        assert max_diff(r._moe(m, x), f64([want])) < 1e-14


def test_swiglu_limit_model(tmp):
    """swiglu_limit 0.5 in config.json (f32 weights, layers dense, MoE, dense, MoE) clamps some
    gate and up values of MoE experts, only there, and moves the logits; 1e9 equals no limit.
    On the FP8 checkpoint the MTP layer (MoE) is clamped too."""
    plain, _ = run(_model_dirs(tmp)["f32"], dense_window=4)
    limited_dir = _with_limit(tmp, "f32", 0.5)
    r = reference(limited_dir, dense_window=4)
    assert r.config.swiglu_limit == 0.5
    seen = []
    swiglu = ref.swiglu

    def recording(gate, up, limit=None):
        seen.append((limit, bool((gate > 0.5).any()), bool((up.abs() > 0.5).any())))
        return swiglu(gate, up, limit)

    ref.swiglu = recording
    try:
        with torch.no_grad():
            limited, _ = r.forward(TOKENS)
    finally:
        ref.swiglu = swiglu
    # Dense layers 0 and 2 run one unclamped MLP each; layers 1 and 3 run experts + shared, clamped.
    assert [limit for limit, _, _ in seen].count(None) == 2 and len(seen) > 2, seen
    assert all(limit in (None, 0.5) for limit, _, _ in seen)
    assert any(g for limit, g, _ in seen if limit) and any(u for limit, _, u in seen if limit), seen
    assert max_diff(plain, limited) > 1e-3, max_diff(plain, limited)
    huge, _ = run(_with_limit(tmp, "f32", 1e9), dense_window=4)
    assert max_diff(plain, huge) < 1e-12
    # Layer by layer: the limit leaves a dense layer's output as it is and changes a MoE layer's.
    unlimited = reference(_model_dirs(tmp)["f32"], dense_window=4)
    config = r.config
    hidden = r._weight(r._embedding_and_head()[0])[torch.tensor(TOKENS, dtype=torch.long)]
    cos, sin = ds.rope_tables(config, len(TOKENS))
    with torch.no_grad():
        for layer in range(config.num_layers):
            with_limit, _ = r._decoder_layer(layer, hidden, cos, sin, None)
            without, _ = unlimited._decoder_layer(layer, hidden, cos, sin, None)
            if config.mlp_type(layer) == "dense":
                assert torch.equal(with_limit, without), layer
            else:
                assert max_diff(with_limit, without) > 1e-3, layer
            hidden = without
    # MTP (a MoE layer): the clamp reaches the MTP logits beyond what the main model changes.
    fp8 = reference(_model_dirs(tmp)["fp8"], dense_window=4)
    fp8_limited = reference(_with_limit(tmp, "fp8", 0.5), dense_window=4)
    assert fp8_limited.config.mlp_type(fp8_limited.config.num_layers) == "sparse"
    with torch.no_grad():
        main_hidden, _ = fp8.hidden_states(TOKENS)
        y, _ = fp8._mtp_layer(main_hidden[:-1], TOKENS[1:])
        y_limited, _ = fp8_limited._mtp_layer(main_hidden[:-1], TOKENS[1:])
    assert max_diff(y, y_limited) > 1e-3


def test_swiglu_limit_dense_model(tmp):
    """A model whose every MLP is dense (MTP included: first_k_dense_replace 5 > 4 layers) gives
    the same logits and MTP logits with and without swiglu_limit."""
    raw = dict(f32_config(), first_k_dense_replace=5, num_nextn_predict_layers=1)
    del raw["mlp_layer_types"]
    directory = os.path.join(tmp, "all_dense")
    if not os.path.exists(directory):
        make_checkpoint(directory, raw, 24, "F32", "F32")
    limited_dir = os.path.join(tmp, "all_dense_limit")
    if not os.path.exists(limited_dir):
        make_checkpoint(limited_dir, dict(raw, swiglu_limit=0.1), 24, "F32", "F32")
    plain, limited = reference(directory, dense_window=4), reference(limited_dir, dense_window=4)
    assert limited.config.swiglu_limit == 0.1
    assert [limited.config.mlp_type(i) for i in range(5)] == ["dense"] * 5
    with torch.no_grad():
        assert torch.equal(plain.forward(TOKENS)[0], limited.forward(TOKENS)[0])
        assert torch.equal(plain.mtp_logits(TOKENS), limited.mtp_logits(TOKENS))


def test_command_line(tmp):
    dirs = _model_dirs(tmp)
    tokens = ",".join(map(str, TOKENS))
    out, dump_path = os.path.join(tmp, "logits.bin"), os.path.join(tmp, "topk.json")
    command = [sys.executable, os.path.join(HERE, "glm5_next_reference.py"), "--model", dirs["f32"], "--tokens", tokens]
    options = ["--out", out, "--dense_window", "4", "--kda_chunk", "3", "--dump_topk", dump_path]
    subprocess.run(command + options, check=True)
    expected, dump = run(dirs["f32"], dense_window=4)
    written = np.fromfile(out, dtype="<f8")
    assert written.size == len(TOKENS) * VOCAB
    assert np.abs(written.reshape(len(TOKENS), VOCAB) - expected.numpy()).max() < 1e-10
    with open(dump_path) as f:
        topk = json.load(f)
    assert [layer["indexer"] for layer in topk["layers"]] == ["none", "full", "none", "full"]
    assert [{int(p): s for p, s in layer["selected"].items()} for layer in topk["layers"]] == dump
    # deepseek_reference.py hands a glm5_next checkpoint to glm5_next_reference.py, options and all.
    main_out, mtp_out = os.path.join(tmp, "main.bin"), os.path.join(tmp, "mtp.bin")
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "deepseek_reference.py"), "--model", dirs["fp8"], "--tokens", tokens]
        + ["--out", main_out, "--mtp_out", mtp_out, "--dense_window", "4", "--kda_chunk", "-1"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "--kda_chunk" in result.stderr, result
    subprocess.run(
        [sys.executable, os.path.join(HERE, "deepseek_reference.py"), "--model=" + dirs["fp8"], "--tokens", tokens]
        + ["--out", main_out, "--mtp_out", mtp_out, "--dense_window", "4"],
        check=True,
    )
    r = reference(dirs["fp8"], dense_window=4)
    with torch.no_grad():
        main_logits, _ = r.forward(TOKENS)
        mtp_logits = r.mtp_logits(TOKENS)
    assert np.array_equal(np.fromfile(main_out, dtype="<f8").reshape(len(TOKENS), VOCAB), main_logits.numpy())
    assert np.array_equal(np.fromfile(mtp_out, dtype="<f8").reshape(len(TOKENS) - 1, VOCAB), mtp_logits.numpy())


# ---------------------------------------------------------------- hyper-connections (mHC)


def _scalar_sinkhorn(logits, iters, eps, columns_first=True):
    """hc_sinkhorn for one n x n matrix in plain Python floats: a softmax over b of each row a,
    + eps, then columns, then iters - 1 rounds of rows and columns, each divided by (sum + eps).
    columns_first=False swaps the two normalisations (a wrong order, to show the check bites)."""
    n = len(logits)
    c = []
    for a in range(n):
        top = max(logits[a])
        exps = [math.exp(z - top) for z in logits[a]]
        c.append([e / sum(exps) + eps for e in exps])

    def columns():
        sums = [sum(c[a][b] for a in range(n)) for b in range(n)]
        for a in range(n):
            c[a] = [c[a][b] / (sums[b] + eps) for b in range(n)]

    def rows():
        for a in range(n):
            total = sum(c[a])
            c[a] = [v / (total + eps) for v in c[a]]

    first, second = (columns, rows) if columns_first else (rows, columns)
    first()
    for _ in range(iters - 1):
        second()
        first()
    return c


def _scalar_hc_weights(streams, fn, base, scale, iters, eps, rms_eps, dim_major=False):
    """pre, post and C of one sub-block for one position's streams [n][D], in plain Python from
    the spec: mixes = fn @ (r / sqrt(mean(r^2) + rms_eps)), r the streams flattened stream-major
    (dim_major=True flattens d-major instead: a wrong order, to show the check bites)."""
    n, dim = len(streams), len(streams[0])
    if dim_major:
        r = [streams[h][d] for d in range(dim) for h in range(n)]
    else:
        r = [streams[h][d] for h in range(n) for d in range(dim)]
    rms = math.sqrt(sum(v * v for v in r) / len(r) + rms_eps)
    mixes = [sum(w * v for w, v in zip(row, r)) / rms for row in fn]
    pre = [sigmoid(mixes[i] * scale[0] + base[i]) + eps for i in range(n)]
    post = [2.0 * sigmoid(mixes[n + i] * scale[1] + base[n + i]) for i in range(n)]
    logits = [[mixes[2 * n + a * n + b] * scale[2] + base[2 * n + a * n + b] for b in range(n)] for a in range(n)]
    return pre, post, _scalar_sinkhorn(logits, iters, eps)


def _scalar_hc_step(streams, pre, post, comb, block, transpose=False):
    """One sub-block in plain Python: y = sum_i pre_i x_i, o = block(y),
    x_new[b] = post_b o + sum_a C[a][b] x[a] (transpose=True uses C[b][a]: a wrong index order)."""
    n, dim = len(streams), len(streams[0])
    y = [sum(pre[i] * streams[i][d] for i in range(n)) for d in range(dim)]
    o = block(y)
    weight = (lambda a, b: comb[b][a]) if transpose else (lambda a, b: comb[a][b])
    return [
        [post[b] * o[d] + sum(weight(a, b) * streams[a][d] for a in range(n)) for d in range(dim)] for b in range(n)
    ]


def test_hc_sinkhorn(_):
    """The mixing matrix: columns sum to 1 (up to eps / S) after any number of rounds, rows within
    1e-3 after the default 20, both to 1e-9 with a tiny eps and many rounds; never negative.
    Against plain Python (with a large eps, so where it enters matters) in the spec's order.

    The last step divides each column by (its sum S + eps), so a column sums to S / (S + eps):
    1 - eps when S is 1, a little more below 1 - eps when S < 1. So a column is within 1e-6 + eps
    of 1, and within 1e-9 of 1 / (1 + eps) once S is within 1e-3 of 1."""
    rng = np.random.default_rng(7)
    logits = torch.from_numpy(rng.standard_normal((64, 4, 4)))
    eps = 1e-6
    c = ref.hc_sinkhorn(logits, 20, eps)
    ones = torch.ones(64, 4, dtype=torch.float64)
    assert (c >= 0).all()
    assert max_diff(c.sum(-2), ones) < 1e-6 + eps, max_diff(c.sum(-2), ones)
    assert max_diff(c.sum(-2), ones / (1 + eps)) < 1e-9, max_diff(c.sum(-2), ones / (1 + eps))
    assert max_diff(c.sum(-1), ones) < 1e-3, max_diff(c.sum(-1), ones)
    once = ref.hc_sinkhorn(logits, 1, eps)  # only the column step: rows are still off by 0.44
    assert max_diff(once.sum(-2), ones) < 10 * eps and max_diff(once.sum(-1), ones) > 0.1
    tight = ref.hc_sinkhorn(logits, 300, 1e-15)
    assert max_diff(tight.sum(-2), ones) < 1e-9 and max_diff(tight.sum(-1), ones) < 1e-9
    assert (tight >= 0).all()
    # Strongly peaked logits (a softmax ~1e-9 off the peak) stay finite and non-negative.
    peaked = ref.hc_sinkhorn(logits * 20, 20, eps)
    assert torch.isfinite(peaked).all() and (peaked >= 0).all()
    eps = 0.05
    for iters in (1, 2, 3, 5):
        got = ref.hc_sinkhorn(logits[:3, :3, :3], iters, eps)
        for m in range(3):
            want = _scalar_sinkhorn(logits[m, :3, :3].tolist(), iters, eps)
            assert max_diff(got[m], f64(want)) < 1e-15, (iters, m)
    wrong = _scalar_sinkhorn(logits[0, :3, :3].tolist(), 3, eps, columns_first=False)
    assert max_diff(ref.hc_sinkhorn(logits[0, :3, :3], 3, eps), f64(wrong)) > 1e-4


def test_hc_hand_sublayer(_):
    """One sub-block with n = 2 streams of D = 2 whose block is o = 2 y.

    Worked by hand: scale = (0, 0, 0) (fn's mixes then count for nothing, though fn is not 0),
    base = (0, ln 3 | 0, ln 3 | 0, ln 3, ln 3, 0), hc_eps ~ 0, x = [[1, 2], [3, -1]]:
      pre  = (sigmoid(0), sigmoid(ln 3)) = (1/2, 3/4)
      post = 2 (sigmoid(0), sigmoid(ln 3)) = (1, 3/2)
      C    = softmax of the rows [0, ln 3], [ln 3, 0] = [[1/4, 3/4], [3/4, 1/4]], already
             doubly stochastic, so Sinkhorn leaves it
      y    = 1/2 (1, 2) + 3/4 (3, -1) = (2.75, 0.25),   o = (5.5, 0.5)
      x_new[0] = 1 o + 1/4 x[0] + 3/4 x[1] = (8, 0.25)
      x_new[1] = 3/2 o + 3/4 x[0] + 1/4 x[1] = (9.75, 2)
    Then a general case (fn, scale and base all non-zero, two positions, large eps and rms eps)
    against the plain-Python loops above, which a d-major flattening or C[b][a] would miss."""
    ln3 = math.log(3.0)
    x = f64([[[1.0, 2.0], [3.0, -1.0]]])
    fn = f64([[((5 * i + 3 * j) % 7 - 3) / 4 for j in range(4)] for i in range(8)])
    base = f64([0.0, ln3, 0.0, ln3, 0.0, ln3, ln3, 0.0])
    pre, post, comb = ref.hc_mix(x, fn, base, f64([0.0, 0.0, 0.0]), 20, 1e-13, 1e-5)
    assert max_diff(pre, f64([[0.5, 0.75]])) < 1e-12, pre
    assert max_diff(post, f64([[1.0, 1.5]])) < 1e-15, post
    assert max_diff(comb, f64([[[0.25, 0.75], [0.75, 0.25]]])) < 1e-12, comb
    y = ref.hc_collapse(x, pre)
    assert max_diff(y, f64([[2.75, 0.25]])) < 1e-12, y
    x_new = ref.hc_expand(x, 2 * y, post, comb)
    assert max_diff(x_new, f64([[[8.0, 0.25], [9.75, 2.0]]])) < 1e-11, x_new

    xs = [[[1.0, 2.0], [3.0, -1.0]], [[0.5, -1.5], [2.0, 0.25]]]
    base_values = [0.3, -0.2, 0.1, 0.4, -0.5, 0.25, 0.6, -0.1]
    scale_values = [0.7, -1.3, 2.0]
    iters, eps, rms_eps = 3, 1e-3, 1e-2
    pre, post, comb = ref.hc_mix(f64(xs), fn, f64(base_values), f64(scale_values), iters, eps, rms_eps)
    x_new = ref.hc_expand(f64(xs), 2 * ref.hc_collapse(f64(xs), pre), post, comb)
    for t, streams in enumerate(xs):
        want = _scalar_hc_weights(streams, fn.tolist(), base_values, scale_values, iters, eps, rms_eps)
        for got, expected in zip((pre[t], post[t], comb[t]), want):
            assert max_diff(got, f64(expected)) < 1e-15, (t, got, expected)
        want_new = _scalar_hc_step(streams, *want, lambda v: [2 * e for e in v])
        assert max_diff(x_new[t], f64(want_new)) < 1e-14, (t, x_new[t], want_new)
        wrong_order = _scalar_hc_weights(streams, fn.tolist(), base_values, scale_values, iters, eps, rms_eps, True)
        assert max_diff(pre[t], f64(wrong_order[0])) > 1e-3
        transposed = _scalar_hc_step(streams, *want, lambda v: [2 * e for e in v], transpose=True)
        assert max_diff(x_new[t], f64(transposed)) > 1e-3


def test_hc_degenerate(_):
    """fn = 0 and scale = 0, pre's base (b0, b1), the others 0: pre_i = sigmoid(b_i) + eps,
    post = (1, 1), C = 1/2 everywhere (up to eps), so x_new[b] = o + mean_a x[a]. A non-zero fn
    under scale 0 gives exactly the same. The head likewise: w_i = sigmoid(base_i) + eps."""
    rng = np.random.default_rng(11)
    x = torch.from_numpy(rng.standard_normal((3, 2, 3)))  # three positions, n = 2, D = 3
    b = [1.5, -0.5]
    base = f64(b + [0.0] * 6)
    eps = 1e-6
    pre, post, comb = ref.hc_mix(x, torch.zeros(8, 6, dtype=torch.float64), base, torch.zeros(3), 20, eps, 1e-5)
    want_pre = f64([sigmoid(v) + eps for v in b])
    assert max_diff(pre, want_pre.expand(3, 2)) < 1e-15 and torch.equal(post, torch.ones(3, 2, dtype=torch.float64))
    assert max_diff(comb, torch.full((3, 2, 2), 0.5, dtype=torch.float64)) < 1e-5
    y = ref.hc_collapse(x, pre)
    assert max_diff(y, want_pre[0] * x[:, 0] + want_pre[1] * x[:, 1]) < 1e-15
    o = y.sin()
    x_new = ref.hc_expand(x, o, post, comb)
    mean = x.mean(1)
    for stream in range(2):
        assert max_diff(x_new[:, stream], o + mean) < 1e-5
    # ... and not simply x + o: the streams are averaged.
    assert max_diff(x_new[:, 0], o + x[:, 0]) > 1e-2
    fn = torch.from_numpy(rng.standard_normal((8, 6)))
    scaled_away = ref.hc_mix(x, fn, base, torch.zeros(3), 20, eps, 1e-5)
    assert all(torch.equal(got, want) for got, want in zip(scaled_away, (pre, post, comb)))
    head = ref.hc_head(x, fn[:2], f64(b), torch.zeros(1), eps, 1e-5)
    assert max_diff(head, y) < 1e-15


def _hc_wiring_model():
    """A two-layer n = 2, hidden 2 model (KDA then full attention; dense then MoE MLP) whose
    mixers and MLPs are replaced by known functions: the tensors, the stubs (torch and
    Python), and the Config."""
    raw = dict(
        BASE_CONFIG,
        hidden_size=2,
        vocab_size=3,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"],
        rms_norm_eps=1e-2,
        hc_mult=2,
        hc_sinkhorn_iters=5,
        hc_eps=1e-3,
    )

    def numbers(rows, cols, salt):
        return [[((5 * i + 3 * j + salt) % 7 - 3) / 4 for j in range(cols)] for i in range(rows)]

    tensors = {
        "model.embed_tokens.weight": [[1.0, -0.5], [0.25, 2.0], [-1.5, 0.75]],
        "lm_head.weight": [[1.0, 0.5], [-0.5, 1.0], [0.25, -2.0]],
        "model.norm.weight": [1.1, 0.9],
        "model.hc_head_fn": numbers(2, 4, 9),
        "model.hc_head_base": [0.2, -0.4],
        "model.hc_head_scale": [0.8],
    }
    for layer in range(2):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = [1.0 + 0.25 * layer, 0.5]
        tensors[p + "post_attention_layernorm.weight"] = [0.75, 1.5 - 0.25 * layer]
        for k, block in enumerate(("hc_attn", "hc_ffn")):
            salt = 2 * layer + k
            tensors[p + block + "_fn"] = numbers(8, 4, salt)
            tensors[p + block + "_base"] = [((3 * i + salt) % 5 - 2) / 4 for i in range(8)]
            tensors[p + block + "_scale"] = [0.5 + 0.25 * salt, 1.0 - 0.125 * salt, 1.5]
    stubs = {
        # mixer of layer L: (L + 1) tanh(x); dense MLP: (x0 - x1, x0 x1); MoE: (2 x1, -x0)
        "attention": (
            lambda layer, x: (layer + 1) * x.tanh(),
            lambda layer, v: [(layer + 1) * math.tanh(e) for e in v],
        ),
        "dense": (
            lambda x: torch.stack((x[:, 0] - x[:, 1], x[:, 0] * x[:, 1]), -1),
            lambda v: [v[0] - v[1], v[0] * v[1]],
        ),
        "sparse": (lambda x: torch.stack((2 * x[:, 1], -x[:, 0]), -1), lambda v: [2 * v[1], -v[0]]),
    }
    return tensors, stubs, ref.Config(raw)


def _scalar_hc_model(tensors, stubs, config, tokens, **mutation):
    """_hc_wiring_model's logits in plain Python from the spec: n copies of the embedding, per
    layer the mixer on input_layernorm(y) and the MLP on post_attention_layernorm(y) of their
    own hc weights, then the head's weighted sum, model.norm and lm_head."""
    n, eps, rms_eps, iters = config.hc_mult, config.hc_eps, config.rms_norm_eps, config.hc_sinkhorn_iters

    def norm(v, weight):
        scale = 1.0 / math.sqrt(sum(e * e for e in v) / len(v) + rms_eps)
        return [e * scale * w for e, w in zip(v, weight)]

    def weights(prefix, streams):
        fn, base, scale = (tensors[prefix + s] for s in ("_fn", "_base", "_scale"))
        return _scalar_hc_weights(streams, fn, base, scale, iters, eps, rms_eps, mutation.get("dim_major", False))

    logits = []
    for token in tokens:
        streams = [list(tensors["model.embed_tokens.weight"][token]) for _ in range(n)]
        for layer in range(config.num_layers):
            p = f"model.layers.{layer}."
            transpose = mutation.get("transpose", False)
            attention_norm, mlp_norm = p + "input_layernorm.weight", p + "post_attention_layernorm.weight"
            if mutation.get("swap_norms"):
                attention_norm, mlp_norm = mlp_norm, attention_norm
            pre, post, comb = weights(p + "hc_attn", streams)
            mixer = lambda y: stubs["attention"][1](layer, norm(y, tensors[attention_norm]))  # noqa: E731
            streams = _scalar_hc_step(streams, pre, post, comb, mixer, transpose)
            pre, post, comb = weights(p + "hc_ffn", streams)
            mlp = lambda y: stubs[config.mlp_type(layer)][1](norm(y, tensors[mlp_norm]))  # noqa: E731
            streams = _scalar_hc_step(streams, pre, post, comb, mlp, transpose)
        r = [e for stream in streams for e in stream]
        rms = math.sqrt(sum(e * e for e in r) / len(r) + rms_eps)
        hm = [sum(w * e for w, e in zip(row, r)) / rms for row in tensors["model.hc_head_fn"]]
        head_scale, head_base = tensors["model.hc_head_scale"][0], tensors["model.hc_head_base"]
        w = [sigmoid(hm[i] * head_scale + head_base[i]) + eps for i in range(n)]
        y = [sum(w[i] * streams[i][d] for i in range(n)) for d in range(len(streams[0]))]
        logits.append(matvec(tensors["lm_head.weight"], norm(y, tensors["model.norm.weight"])))
    return logits


def test_hc_layers_and_head(_):
    """The Reference's layer and head wiring with n = 2: mixers and MLPs replaced by known
    functions, logits against _scalar_hc_model to 1e-13. The same scalar model with the two
    norms swapped, C transposed or the streams flattened d-major differs. A hyper-connection
    tensor of the wrong shape is refused by name."""
    tensors, stubs, config = _hc_wiring_model()
    r = ref.Reference(config, DictCheckpoint(tensors))
    r._attention = lambda layer, x, cos, sin, previous: (stubs["attention"][0](layer, x), (None, {}))
    r._mlp = lambda prefix, x: stubs["dense"][0](x)
    r._moe = lambda prefix, x: stubs["sparse"][0](x)
    tokens = [2, 0, 1, 2]
    with torch.no_grad():
        got, selections = r.forward(tokens)
    assert selections == [{}, {}]
    want = f64(_scalar_hc_model(tensors, stubs, config, tokens))
    assert max_diff(got, want) < 1e-13, (got, want)
    for mutation in ("swap_norms", "transpose", "dim_major"):
        wrong = f64(_scalar_hc_model(tensors, stubs, config, tokens, **{mutation: True}))
        assert max_diff(got, wrong) > 1e-4, (mutation, max_diff(got, wrong))
    for name, value in (("model.layers.1.hc_ffn_scale", [1.0, 1.0]), ("model.hc_head_fn", [[1.0] * 4] * 3)):
        bad = ref.Reference(config, DictCheckpoint(dict(tensors, **{name: value})))
        bad._attention, bad._mlp, bad._moe = r._attention, r._mlp, r._moe
        try:
            bad.forward(tokens)
        except SystemExit as e:
            assert name + ": shape" in str(e), str(e)
        else:
            raise AssertionError(f"accepted {name} {value}")


def _decode_hc(r, tokens):
    """A hyper-connection model's logits computed one position at a time, as an engine decodes:
    the position's streams [1, n, hidden] through every layer, each KDA layer carrying its
    (conv, S) state from position to position, each full-attention layer attending over the
    inputs it cached for the positions so far (its keys and values are functions of those).
    Returns the logits and the largest difference between two streams seen."""
    config = r.config
    n, eps = config.hc_mult, config.rms_norm_eps
    embedding_name, head_name = r._embedding_and_head()
    embedding, head = r._weight(embedding_name), r._weight(head_name)
    cos, sin = ds.rope_tables(config, len(tokens))
    kda_states = [None] * config.num_layers
    cached = [[] for _ in range(config.num_layers)]
    rows, spread = [], 0.0
    for t, token in enumerate(tokens):
        streams = embedding[token].expand(1, n, -1).clone()
        for layer in range(config.num_layers):
            p = f"model.layers.{layer}."
            pre, post, comb = r._hc_mix(p + "hc_attn", streams)
            x = ds.rms_norm(ref.hc_collapse(streams, pre), r._weight(p + "input_layernorm.weight"), eps)
            if config.layer_type(layer) == "linear_attention":
                out, kda_states[layer] = r.kda_mixer(layer, x, state=kda_states[layer], start=t)
            else:
                cached[layer].append(x)
                out, _ = r._attention(layer, torch.cat(cached[layer]), cos[: t + 1], sin[: t + 1], None)
                out = out[-1:]
            streams = ref.hc_expand(streams, out, post, comb)
            pre, post, comb = r._hc_mix(p + "hc_ffn", streams)
            x = ds.rms_norm(ref.hc_collapse(streams, pre), r._weight(p + "post_attention_layernorm.weight"), eps)
            out = r._moe(p + "mlp", x) if config.mlp_type(layer) == "sparse" else r._mlp(p + "mlp", x)
            streams = ref.hc_expand(streams, out, post, comb)
            spread = max(spread, max_diff(streams[0, 0], streams[0, n - 1]))
        fn, base, scale = r.hc_weights("model.hc_head")
        y = ref.hc_head(streams, fn, base, scale, config.hc_eps, eps)
        rows.append(ds.rms_norm(y, r._weight("model.norm.weight"), eps) @ head.T)
    return torch.cat(rows), spread


def test_hc_model(tmp):
    """End to end on the tiny hyper-connection checkpoints (n = 4, F32; n = 2, BF16 fn): every hc
    tensor is read, runs are bit-identical, prefill equals position-by-position decode (KDA
    state carried, attention over cached inputs; with a dense window of 4 and index_topk 3,
    so the indexer selects too), and one entry of an hc tensor moves the logits. hc_mult 1
    written into the plain f32 model's config reads no hc tensor and changes nothing.

    Layer 0's attention sees n equal streams (copies of the embedding), so there its pre
    weights only scale y, which input_layernorm undoes (up to rms_norm_eps), and C, whose
    columns sum to ~1, gives every stream back the embedding: only post matters. Its pre row
    of hc_attn_fn barely moves the logits; its post row does. Later, pre and C matter."""
    dirs = _model_dirs(tmp)
    for name in ("hc4", "hc2_mtp"):
        r = reference(dirs[name], dense_window=4, index_topk=3)
        config = r.config
        n = config.hc_mult
        read = set()
        get = r.checkpoint.get

        def recording(tensor, get=get):
            read.add(tensor)
            return get(tensor)

        r.checkpoint.get = recording
        with torch.no_grad():
            logits, dump = r.forward(TOKENS)
        r.checkpoint.get = get
        parts = ("fn", "base", "scale")
        expected = {f"model.layers.{i}.hc_{b}_{s}" for i in range(4) for b in ("attn", "ffn") for s in parts}
        expected |= {f"model.hc_head_{s}" for s in parts}
        assert {t for t in read if "hc_" in t} == expected, (name, sorted(read))
        assert torch.isfinite(logits).all() and logits.shape == (len(TOKENS), VOCAB)
        assert any(selected for selected in dump), name  # the indexer ran past the window
        with torch.no_grad():
            again, _ = reference(dirs[name], dense_window=4, index_topk=3).forward(TOKENS)
            decoded, spread = _decode_hc(r, TOKENS)
        assert torch.equal(logits, again), name
        assert max_diff(logits, decoded) < 1e-10, (name, max_diff(logits, decoded))
        assert spread > 1e-2, (name, spread)  # the streams do come apart
        mutations = (
            ("model.layers.0.hc_attn_fn", (0, 0), False),  # pre of equal streams: normalised away
            ("model.layers.0.hc_attn_fn", (n + 1, 0), True),  # a post weight's mix
            ("model.layers.1.hc_attn_fn", (0, 0), True),  # a pre weight's mix
            ("model.layers.1.hc_attn_fn", (2 * n + 1, 3), True),  # a C logit's mix
            ("model.layers.2.hc_ffn_base", (n,), True),  # a post weight
            ("model.hc_head_fn", (1, 5), True),
        )
        for tensor, index, moves in mutations:

            def changed(t, tensor=tensor, index=index):
                value = get(t)
                if t == tensor:
                    value = value.clone()
                    value[index] += 1.0
                return value

            r.checkpoint.get = changed
            with torch.no_grad():
                moved, _ = r.forward(TOKENS)
            r.checkpoint.get = get
            assert (max_diff(logits, moved) > 1e-3) == moves, (name, tensor, index, max_diff(logits, moved))
    one = reference(_with_keys(tmp, "f32", "hc1", hc_mult=1, hc_sinkhorn_iters=0), dense_window=4)
    read = []
    get = one.checkpoint.get
    one.checkpoint.get = lambda tensor: read.append(tensor) or get(tensor)
    with torch.no_grad():
        plain_logits, _ = one.forward(TOKENS)
    assert read and not any("hc_" in t for t in read)
    assert torch.equal(plain_logits, run(dirs["f32"], dense_window=4)[0])


def test_hc_mtp_refused(tmp):
    """A hyper-connection model with an MTP layer: its logits work (in process and on the
    command line, also through deepseek_reference.py), MTP logits and drafts are refused with
    an error naming hc_mult, before the main-model pass."""
    directory = _model_dirs(tmp)["hc2_mtp"]
    r = reference(directory, dense_window=4)
    assert r.config.num_nextn_predict_layers == 1 and r.config.hc_mult == 2
    with torch.no_grad():
        logits, _ = r.forward(TOKENS)
    main_pass = r.hidden_states
    r.hidden_states = lambda tokens: (_ for _ in ()).throw(AssertionError("the main model ran first"))
    calls = (("mtp_forward", lambda: r.mtp_forward(TOKENS)), ("mtp_draft", lambda: r.mtp_draft(TOKENS, 5, 2)))
    for name, call in calls:
        try:
            call()
        except SystemExit as e:
            assert "hc_mult 2" in str(e) and "num_nextn_predict_layers 1" in str(e), (name, str(e))
        else:
            raise AssertionError(f"{name} ran on a hyper-connection model")
    r.hidden_states = main_pass
    tokens = ",".join(map(str, TOKENS))
    out = os.path.join(tmp, "hc_logits.bin")
    script = os.path.join(HERE, "glm5_next_reference.py")
    common = ["--model", directory, "--tokens", tokens, "--dense_window", "4"]
    subprocess.run([sys.executable, script] + common + ["--out", out, "--kda_chunk", "4"], check=True)
    written = np.fromfile(out, dtype="<f8").reshape(len(TOKENS), VOCAB)
    assert np.abs(written - logits.numpy()).max() < 1e-10
    refused = [
        [script, "--out", out, "--mtp_out", os.path.join(tmp, "hc_mtp.bin")],
        [os.path.join(HERE, "deepseek_reference.py"), "--out", out, "--mtp_draft", "2", "--mtp_next", "5"],
    ]
    for command in refused:
        result = subprocess.run([sys.executable, command[0]] + common + command[1:], capture_output=True, text=True)
        assert result.returncode != 0 and "hc_mult 2" in result.stderr, (command, result)


# ---------------------------------------------------------------- pooled indexer keys (index_kpool)


def _kpool_hand_model():
    """One full_attention layer's indexer (hidden 2, I = 2, two heads, NoPE, P = 2, index_topk 2:
    one pool per query) with explicit tensors, seven positions' inputs x and q latents."""
    raw = dict(
        BASE_CONFIG,
        hidden_size=2,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        mlp_layer_types=["dense"],
        q_lora_rank=2,
        qk_rope_head_dim=0,
        index_n_heads=2,
        index_head_dim=2,
        index_topk=2,
        index_kpool=2,
    )
    i = "model.layers.0.self_attn.indexer."
    tensors = {
        i + "wk.weight": [[1.0, 0.0], [0.0, 1.0]],
        i + "k_norm.weight": [1.5, 0.5],
        i + "k_norm.bias": [0.25, -0.5],
        i + "wq_b.weight": [[1.0, 0.5], [-0.5, 1.0], [0.25, -1.0], [1.0, 0.75]],  # head 0 rows, then head 1
        i + "weights_proj.weight": [[1.0, -0.5], [0.5, 0.75]],
        i + "index_kpool_compress_gate": [[1.0, 0.0], [0.0, 1.0]],
        i + "index_kpool_compress_ape": [[0.0, 0.0], [1.5 + math.log(3.0), -2.5]],
    }
    xs = [[1.0, -1.0], [-0.5, 1.5], [2.0, 0.5], [0.25, -0.75], [-1.0, -2.0], [0.5, 1.0], [1.5, -0.25]]
    # Position 5's q latent is 0: all its scores are exactly 0, a tie the lowest pool wins.
    q_latents = [[0.5, 1.0], [1.0, -1.0], [-0.75, 0.5], [1.25, 0.25], [-0.5, -1.5], [0.0, 0.0], [2.0, -0.5]]
    return ref.Config(raw), tensors, xs, q_latents


def _scalar_kpool(config, tensors, xs, q_latents, window):
    """The pooled indexer of layer 0 in plain Python from the spec: pooled keys (every complete
    pool of the sequence), each query's scores against them, its chosen pools and its tail,
    for the queries past the dense window."""
    i = "model.layers.0.self_attn.indexer."
    pool, topk = config.index_kpool, config.index_topk
    heads, dim = config.index_n_heads, config.index_head_dim
    keys, gates = [], []
    for x in xs:
        k = matvec(tensors[i + "wk.weight"], x)
        mean = sum(k) / dim
        var = sum((v - mean) ** 2 for v in k) / dim
        weight, bias = tensors[i + "k_norm.weight"], tensors[i + "k_norm.bias"]
        keys.append([(v - mean) / math.sqrt(var + 1e-6) * w + b for v, w, b in zip(k, weight, bias)])
        gates.append(matvec(tensors[i + "index_kpool_compress_gate"], x))
    ape = tensors[i + "index_kpool_compress_ape"]
    pooled = []
    for j in range(len(xs) // pool):
        key = []
        for d in range(dim):
            logits = [gates[j * pool + m][d] + ape[m][d] for m in range(pool)]
            exps = [math.exp(z - max(logits)) for z in logits]
            key.append(sum(exps[m] / sum(exps) * keys[j * pool + m][d] for m in range(pool)))
        pooled.append(key)
    scores, pools, tails = {}, {}, {}
    for s in range(window, len(xs)):
        q_all = matvec(tensors[i + "wq_b.weight"], q_latents[s])
        head_weights = matvec(tensors[i + "weights_proj.weight"], xs[s])
        row = []
        for key in pooled:
            score = 0.0
            for h in range(heads):
                dot = sum(a * b for a, b in zip(q_all[h * dim : (h + 1) * dim], key))
                score += head_weights[h] * heads**-0.5 * max(dot, 0.0) * dim**-0.5
            row.append(score)
        scores[s] = row
        complete = (s + 1) // pool
        pools[s] = sorted(sorted(range(complete), key=lambda j: (-row[j], j))[: topk // pool])
        tails[s] = list(range(complete * pool, s + 1))
    return pooled, scores, pools, tails


def test_kpool_hand(_):
    """The pooled indexer of one layer (P = 2, I = 2, seven positions, dense window 2) against
    _scalar_kpool: pooled keys, pooled scores, chosen pools and tails, to 1e-14.

    Pool 0 by hand. wk is the identity and k_norm a LayerNorm over two values, so the key of
    x = (a, b) is sign(a - b) (1, -1) * (1.5, 0.5) + (0.25, -0.5) (up to the LayerNorm's eps):
    k_0 = (1.75, -1) for x_0 = (1, -1), k_1 = (-1.25, 0) for x_1 = (-0.5, 1.5). The gate is the
    identity too, g_t = x_t, so the pool's logits are
      dim 0: (1 + 0, -0.5 + 1.5 + ln 3) = (1, 1 + ln 3)  -> weights (1/4, 3/4)
      dim 1: (-1 + 0, 1.5 - 2.5)        = (-1, -1)      -> weights (1/2, 1/2)
      pk_0 = (1.75/4 - 3 * 1.25/4, -1/2 + 0/2) = (-0.5, -0.5).
    Queries: 2 has one complete pool (taken) and the tail {2}; 3 and 5 complete a pool and
    have no tail; 5's q latent is 0, so its three scores tie at 0 and pool 0 wins: 5 does not
    attend to itself. A gate or ape of the wrong shape is refused by name."""
    config, tensors, xs, q_latents = _kpool_hand_model()
    assert config.index_kpool == 2
    r = ref.Reference(config, DictCheckpoint(tensors), dense_window=2)
    x, q_latent = f64(xs), f64(q_latents)
    cos, sin = ds.rope_tables(config, len(xs))
    with torch.no_grad():
        pooled, scores = r.kpool_indexer_scores(0, x, q_latent, cos, sin, 2)
        allowed, dump = r._select(0, x, q_latent, cos, sin, None)
    assert max_diff(pooled[0], f64([-0.5, -0.5])) < 1e-5, pooled[0]
    want_pooled, want_scores, want_pools, want_tails = _scalar_kpool(config, tensors, xs, q_latents, 2)
    assert max_diff(pooled, f64(want_pooled)) < 1e-14, (pooled, want_pooled)
    assert max_diff(scores, f64([want_scores[s] for s in range(2, 7)])) < 1e-14, (scores, want_scores)
    want_dump = {s: [p * 2 + m for p in want_pools[s] for m in range(2)] + want_tails[s] for s in range(2, 7)}
    assert dump == want_dump, (dump, want_dump)
    # The worked case: which pools, which tails (also what _scalar_kpool derived).
    assert want_pools == {2: [0], 3: [1], 4: [0], 5: [0], 6: [1]}, want_pools
    assert want_tails == {2: [2], 3: [], 4: [4], 5: [], 6: [6]}, want_tails
    assert set(want_scores[5]) == {0.0}
    assert dump[5] == [0, 1] and dump[6] == [2, 3, 6], dump
    for s in range(7):
        want_row = [t <= s for t in range(7)] if s < 2 else [t in want_dump[s] for t in range(7)]
        assert allowed[s].tolist() == want_row, (s, allowed[s])
    prefix = "model.layers.0.self_attn.indexer."
    wrong = (
        ("index_kpool_compress_gate", [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
        ("index_kpool_compress_ape", [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]),
    )
    for name, value in wrong:
        bad = ref.Reference(config, DictCheckpoint(dict(tensors, **{prefix + name: value})), dense_window=2)
        try:
            bad._select(0, x, q_latent, cos, sin, None)
        except SystemExit as e:
            assert prefix + name + ": shape" in str(e), str(e)
        else:
            raise AssertionError(f"accepted {name} {value}")


def _check_pooled_structure(selected, position, pool, topk):
    """One query's selection past the window is whole complete pools, min(C, topk / P) of them,
    plus its whole tail; returns (pools chosen, complete pools, tail)."""
    complete = (position + 1) // pool
    tail = list(range(complete * pool, position + 1))
    assert selected == sorted(set(selected)) and selected[len(selected) - len(tail) :] == tail, (position, selected)
    members = selected[: len(selected) - len(tail)]
    chosen = sorted({t // pool for t in members})
    assert members == [j * pool + m for j in chosen for m in range(pool)], (position, selected)
    assert len(chosen) == min(complete, topk // pool) and all(j < complete for j in chosen), (position, selected)
    return chosen, complete, tail


def test_kpool_selection_rule(tmp):
    """kpool_positions on given scores: the tail is always attended, complete pools not chosen
    are left out, a pool that is not complete yet is never chosen however high its score, a
    query that completes a pool has no tail (and need not see itself), equal scores prefer the
    lower pool, and with fewer complete pools than topk / P everything causal is attended.
    Then every selection the two pooled checkpoints make past a dense window of 4 has that
    shape, and some of them leave complete pools out, leave the query itself out, or have a
    tail of P - 1 positions."""

    def positions(scores, position, pool, topk):
        return ref.kpool_positions(f64(scores), position, pool, topk).tolist()

    scores = [0.5, 0.2, 0.9, 5.0]  # pool 3 (positions 9..11) is the best, but not complete at 10
    assert positions(scores, 10, 3, 6) == [0, 1, 2, 6, 7, 8, 9, 10]
    assert positions(scores, 9, 3, 6) == [0, 1, 2, 6, 7, 8, 9]
    assert positions(scores, 8, 3, 6) == [0, 1, 2, 6, 7, 8]  # completes pool 2: no tail
    assert positions([0.5, 0.9, 0.2, 5.0], 8, 3, 6) == [0, 1, 2, 3, 4, 5]  # ... and not itself
    assert positions([0.5, 0.9, 0.2, 5.0], 8, 3, 3) == [3, 4, 5]
    assert positions([1.0, 1.0, 1.0], 8, 3, 6) == [0, 1, 2, 3, 4, 5]  # ties: the lower pools
    assert positions([2.0, 1.0, 1.0], 8, 3, 6) == [0, 1, 2, 3, 4, 5]
    assert positions([0.0, 2.0, 2.0], 8, 3, 3) == [3, 4, 5]
    assert positions([-1.0, -3.0, -2.0], 8, 3, 6) == [0, 1, 2, 6, 7, 8]  # negative scores rank too
    assert positions([0.1, 5.0], 4, 3, 6) == [0, 1, 2, 3, 4]  # one complete pool: all causal keys
    assert positions([5.0], 1, 3, 6) == [0, 1]  # no complete pool: the tail alone
    assert positions([0.3, 0.1, 0.2, 0.4], 7, 2, 4) == [0, 1, 6, 7]

    seen = {"pools left out": False, "not itself": False, "full tail": False}
    for directory, config in ((d, ref.load(d)[0]) for d in _kpool_dirs(tmp).values()):
        pool, topk = config.index_kpool, 4
        _, dump = run(directory, dense_window=4)
        for layer, selected in enumerate(dump):
            if config.indexer_type(layer) == "none":
                assert selected == {}, (directory, layer)
                continue
            assert sorted(selected) == list(range(4, len(TOKENS))), (directory, layer)
            for position, keys in selected.items():
                chosen, complete, tail = _check_pooled_structure(keys, position, pool, topk)
                seen["pools left out"] |= len(chosen) < complete
                seen["not itself"] |= position not in keys
                seen["full tail"] |= len(tail) == pool - 1
    assert all(seen.values()), seen


def _decode(r, tokens):
    """The logits of a plain-residual model computed one position at a time, as an engine
    decodes: each KDA layer carries its (conv, S) state from position to position, each
    full-attention layer attends over the inputs it cached for the positions so far (its keys,
    values and pooled keys are functions of those), selecting for the newest one."""
    config = r.config
    eps = config.rms_norm_eps
    embedding_name, head_name = r._embedding_and_head()
    embedding, head = r._weight(embedding_name), r._weight(head_name)
    cos, sin = ds.rope_tables(config, len(tokens))
    kda_states = [None] * config.num_layers
    cached = [[] for _ in range(config.num_layers)]
    rows = []
    for t, token in enumerate(tokens):
        hidden = embedding[token][None]
        for layer in range(config.num_layers):
            p = f"model.layers.{layer}."
            x = ds.rms_norm(hidden, r._weight(p + "input_layernorm.weight"), eps)
            if config.layer_type(layer) == "linear_attention":
                out, kda_states[layer] = r.kda_mixer(layer, x, state=kda_states[layer], start=t)
            else:
                cached[layer].append(x)
                out, _ = r._attention(layer, torch.cat(cached[layer]), cos[: t + 1], sin[: t + 1], None)
                out = out[-1:]
            hidden = hidden + out
            x = ds.rms_norm(hidden, r._weight(p + "post_attention_layernorm.weight"), eps)
            hidden = hidden + (r._moe(p + "mlp", x) if config.mlp_type(layer) == "sparse" else r._mlp(p + "mlp", x))
        rows.append(ds.rms_norm(hidden, r._weight("model.norm.weight"), eps) @ head.T)
    return torch.cat(rows)


def _changed_entry(get, tensor, index, delta):
    """A checkpoint reader that adds delta to one entry of one tensor."""

    def changed(name):
        value = get(name)
        if name == tensor:
            value = value.clone()
            value[index] += delta
        return value

    return changed


def test_kpool_model(tmp):
    """End to end on the pooled checkpoints (P = 2: F32 with indexer RoPE; P = 4: FP8 gate,
    NoPE, two shards, an MTP layer), dense window 6: every pooling tensor is read (the MTP
    layer's by the MTP), runs are bit-identical, prefill equals position-by-position decode,
    and one entry of a gate or an ape moves the logits past the window while the rows inside
    it stay bit-identical; the MTP layer's own ape moves only the MTP logits past its window.
    With P = 1 and any gate, the pooled scores are the unpooled indexer's (the same keys, q and
    head weights). The command line dumps the pooled selection."""
    dirs = _kpool_dirs(tmp)
    # 6: past it both models select (P = 4 from query 7, with two complete pools), and inside it
    # P = 2's query 5 (three complete pools, index_topk 4) would not see everything if pooled.
    window = 6
    for name, directory in dirs.items():
        r = reference(directory, dense_window=window)
        config = r.config
        read = set()
        get = r.checkpoint.get
        r.checkpoint.get = lambda tensor, get=get: read.add(tensor) or get(tensor)
        with torch.no_grad():
            logits, dump = r.forward(TOKENS)
            mtp = r.mtp_logits(TOKENS) if config.num_nextn_predict_layers else None
        r.checkpoint.get = get
        layers = range(config.num_layers + config.num_nextn_predict_layers)  # the MTP layer's too
        indexed = [i for i in layers if config.indexer_type(i) == "full"]
        parts = ("gate", "ape")
        expected = {f"model.layers.{i}.self_attn.indexer.index_kpool_compress_{p}" for i in indexed for p in parts}
        pooling_read = {t for t in read if "kpool" in t and not t.endswith("_scale_inv")}
        assert pooling_read == expected, (name, sorted(pooling_read))
        assert torch.isfinite(logits).all() and logits.shape == (len(TOKENS), VOCAB)
        with torch.no_grad():
            again, again_dump = reference(directory, dense_window=window).forward(TOKENS)
            decoded = _decode(r, TOKENS)
        assert torch.equal(logits, again) and again_dump == dump, name
        assert max_diff(logits, decoded) < 1e-10, (name, max_diff(logits, decoded))
        # Pooling matters: the same weights with the unpooled indexer (index_topk 4) differ.
        pool, config.index_kpool = config.index_kpool, 1
        with torch.no_grad():
            unpooled, _ = r.forward(TOKENS)
        config.index_kpool = pool
        assert max_diff(logits[window:], unpooled[window:]) > 1e-3, name
        first_full = indexed[0]
        mutations = [
            (f"model.layers.{first_full}.self_attn.indexer.index_kpool_compress_ape", (1, 3), 8.0),
            (f"model.layers.{indexed[1]}.self_attn.indexer.index_kpool_compress_gate", (1, 3), 8.0),
        ]
        for tensor, index, delta in mutations:
            r.checkpoint.get = _changed_entry(get, tensor, index, delta)
            with torch.no_grad():
                moved, moved_dump = r.forward(TOKENS)
            r.checkpoint.get = get
            assert moved_dump != dump, (name, tensor)
            assert torch.equal(moved[:window], logits[:window]), (name, tensor)
            assert max_diff(moved[window:], logits[window:]) > 1e-6, (name, tensor)
        if mtp is not None:
            tensor = f"model.layers.{config.num_layers}.self_attn.indexer.index_kpool_compress_ape"
            r.checkpoint.get = _changed_entry(get, tensor, (2, 0), 8.0)
            with torch.no_grad():
                moved_main, _ = r.forward(TOKENS)
                moved_mtp = r.mtp_logits(TOKENS)
                prefix_mtp = reference(directory, dense_window=window).mtp_logits(TOKENS[:10])
            r.checkpoint.get = get
            assert torch.equal(moved_main, logits), name
            assert torch.equal(moved_mtp[:window], mtp[:window]), name
            assert max_diff(moved_mtp[window:], mtp[window:]) > 1e-6, name
            assert max_diff(prefix_mtp, mtp[:9]) < 1e-10, name  # the MTP's pooled selection is causal
    # P = 1 (a single-offset ape, any gate): pooled scores == the unpooled indexer's scores.
    r = reference(dirs["kpool2"], dense_window=window)
    layer = 1
    with torch.no_grad():
        x = layer_input(r, TOKENS, layer)
        a = f"model.layers.{layer}.self_attn."
        q_latent = ds.rms_norm(r._linear(a + "q_a_proj", x), r._weight(a + "q_a_layernorm.weight"), 1e-6)
        cos, sin = ds.rope_tables(r.config, len(TOKENS))
        unpooled = ds.Reference._indexer_scores(r, layer, x, q_latent, cos, sin, window)
        gate, ape = r.kpool_weights(layer)
        r.config.index_kpool = 1
        r.kpool_weights = lambda _: (gate, ape[:1])
        keys, single = r.kpool_indexer_scores(layer, x, q_latent, cos, sin, window)
    assert keys.shape == (len(TOKENS), r.config.index_head_dim)
    assert max_diff(single, unpooled) < 1e-13, max_diff(single, unpooled)
    # The command line: the same logits and the pooled selection in --dump_topk.
    out, dump_path = os.path.join(tmp, "kpool_logits.bin"), os.path.join(tmp, "kpool_topk.json")
    command = [sys.executable, os.path.join(HERE, "glm5_next_reference.py"), "--model", dirs["kpool2"]]
    command += ["--tokens", ",".join(map(str, TOKENS)), "--out", out, "--dense_window", "4", "--dump_topk", dump_path]
    subprocess.run(command, check=True)
    expected, dump = run(dirs["kpool2"], dense_window=4)
    written = np.fromfile(out, dtype="<f8").reshape(len(TOKENS), VOCAB)
    assert np.array_equal(written, expected.numpy())
    with open(dump_path) as f:
        topk = json.load(f)
    assert [{int(p): s for p, s in layer["selected"].items()} for layer in topk["layers"]] == dump


TESTS = [
    test_hand_kda_steps,
    test_causal_conv,
    test_gate_formulas,
    test_scalar_mixer,
    test_chunked_equals_recurrent,
    test_resume_from_state,
    test_causality,
    test_lower_bound_changes_the_gate,
    test_mutations_change_logits,
    test_sparse_selection,
    test_nope,
    test_fp8_and_mtp,
    test_swiglu_limit_hand_expert,
    test_swiglu_limit_model,
    test_swiglu_limit_dense_model,
    test_hc_sinkhorn,
    test_hc_hand_sublayer,
    test_hc_degenerate,
    test_hc_layers_and_head,
    test_hc_model,
    test_hc_mtp_refused,
    test_kpool_hand,
    test_kpool_selection_rule,
    test_kpool_model,
    test_config_rules,
    test_command_line,
]


def main():
    import deepseek_reference_selftest  # its runner; no test of its runs on import

    return deepseek_reference_selftest.run_tests(TESTS)


if __name__ == "__main__":
    sys.exit(main())
