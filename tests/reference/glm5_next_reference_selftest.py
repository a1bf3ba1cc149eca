#!/usr/bin/python3
"""Self-test of glm5_next_reference.py (Kimi Delta Attention + GLM-5 MLA hybrid), a few seconds.

Writes tiny random glm5_next checkpoints with its own safetensors writer (F32; BF16 with
linear_lower_bound and A_log stored as [1, 1, H, 1]; FP8 block-scaled linears over two shards
with an MTP layer; F32 with qk_rope_head_dim 0). Checks a hand-computed KDA step, a scalar
re-implementation of a whole KDA mixer (both gates), the causal conv convention, chunked ==
recurrent, resuming from a (conv state, S) checkpoint, causality, that a wrong conv tap order
or a missing L2 norm changes the logits, NoPE MLA and indexer, swiglu_limit's clamped SwiGLU
(a hand-computed MoE layer; MoE layers and the MTP layer clamped, dense layers not; 1e9 ==
no limit), the config rules, and the command line (also through deepseek_reference.py).
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
    dirs = {name: os.path.join(tmp, name) for name in ("f32", "bf16_lb", "fp8", "nope")}
    if not os.path.exists(dirs["f32"]):
        make_checkpoint(dirs["f32"], f32_config(), 20, "F32", "F32")
        make_checkpoint(dirs["bf16_lb"], bf16_lb_config(), 21, "BF16", "BF16", a_log_4d=True)
        make_checkpoint(dirs["fp8"], fp8_config(), 22, "F8_E4M3", "BF16", shards=2)
        make_checkpoint(dirs["nope"], nope_config(), 23, "F32", "F32")
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
    # Trivial values of the keys this version does not implement are accepted.
    ref.Config(dict(f32_config(), hc_mult=1, index_kpool=None))
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
        "hc_mult": dict(f32_config(), hc_mult=4),
        "index_kpool": dict(f32_config(), index_kpool=4),
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


def _with_limit(tmp, name, limit):
    """A copy of checkpoint `name` whose config.json says swiglu_limit `limit` (same weights,
    linked, not rewritten)."""
    source = _model_dirs(tmp)[name]
    directory = os.path.join(tmp, f"{name}_limit_{limit}")
    if not os.path.exists(directory):
        os.makedirs(directory)
        with open(os.path.join(source, "config.json")) as f:
            raw = json.load(f)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(dict(raw, swiglu_limit=limit), f, indent=1)
        for file_name in os.listdir(source):
            if file_name != "config.json":
                os.symlink(os.path.join(source, file_name), os.path.join(directory, file_name))
    return directory


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
    test_config_rules,
    test_command_line,
]


def main():
    import deepseek_reference_selftest  # its runner; no test of its runs on import

    return deepseek_reference_selftest.run_tests(TESTS)


if __name__ == "__main__":
    sys.exit(main())
