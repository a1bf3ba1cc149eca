#!/usr/bin/python3
"""Self-test of deepseek_reference.py on tiny random checkpoints (a few seconds, 2 cores).

Writes one checkpoint per model type with its own safetensors writer: deepseek_v3 in BF16
with q_lora_rank null and YaRN; deepseek_v32 in FP8 (block scale_inv) over two shards;
glm_moe_dsa in BF16 with tied embeddings stored only as lm_head.weight and a shared indexer
layer. Checks the FP8 decoding, the RoPE/YaRN/routing formulas, that the absorbed and plain
MLA agree, causality, the sparse-attention selection, and the command line. The same three
again with one MTP layer check the MTP's input (concat order, position-0 mask, post-norm
hidden), its layer types and own indexer, the shared_head fallback, and greedy drafting.
Exits 0 when everything passes; the last line is 'N passed, M failed'.
"""

import cmath
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
import deepseek_reference as ref  # noqa: E402

TOKENS = [3, 17, 42, 5, 9, 63, 0, 28, 28, 11, 50, 7, 33, 19]

BASE_CONFIG = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "vocab_size": 64,
    "rms_norm_eps": 1e-6,
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
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.9,
    "mscale_all_dim": 0.7,
}

INDEXER = {"index_topk": 5, "index_n_heads": 3, "index_head_dim": 16}


# ---------------------------------------------------------------- safetensors writer


def bf16_bytes(values):
    """Round-to-nearest-even float32 -> bfloat16."""
    bits = np.ascontiguousarray(values, dtype="<f4").view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def e4m3_nearest(values):
    """Bytes of the nearest float8_e4m3fn value (finite, |v| <= 448)."""
    magnitudes = ref.E4M3FN[:0x7F]  # 0x00..0x7E: the finite non-negative values, increasing
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    codes = np.abs(np.abs(flat)[:, None] - magnitudes[None, :]).argmin(1).astype(np.uint8)
    return (codes | np.where(flat < 0, 0x80, 0).astype(np.uint8)).reshape(np.shape(values))


def encode(dtype, values):
    if dtype == "F32":
        return np.ascontiguousarray(values, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(values, dtype="<f2").tobytes()
    if dtype == "BF16":
        return bf16_bytes(values)
    if dtype == "F8_E4M3":  # values are already the bytes
        return np.ascontiguousarray(values, dtype=np.uint8).tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, array)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, values) in tensors.items():
        blob = encode(dtype, values)
        header[name] = {"dtype": dtype, "shape": list(np.shape(values)), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def quantize_fp8(weight, block):
    """Block-scaled E4M3 bytes and the F32 scale_inv, as DeepSeek's FP8 checkpoints store them."""
    rows, cols = weight.shape
    block_rows, block_cols = block
    scale = np.zeros((-(-rows // block_rows), -(-cols // block_cols)), dtype=np.float32)
    codes = np.zeros(weight.shape, dtype=np.uint8)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = weight[i * block_rows : (i + 1) * block_rows, j * block_cols : (j + 1) * block_cols]
            scale[i, j] = max(np.abs(tile).max(), 1e-12) / 448.0
            codes[i * block_rows : (i + 1) * block_rows, j * block_cols : (j + 1) * block_cols] = e4m3_nearest(
                tile / float(scale[i, j])
            )
    return codes, scale


# ---------------------------------------------------------------- tiny checkpoints


def make_checkpoint(directory, raw_config, seed, linear_dtype, norm_dtype, shards=1, tied_store=None):
    """Random weights for raw_config. linear_dtype "F8_E4M3" stores the projection weights as
    FP8 + scale_inv (the router gate, indexer weights_proj, embeddings and heads stay BF16).
    tied_store names the one tensor a tied checkpoint keeps. With num_nextn_predict_layers 1
    the MTP layer follows the main layers, so their weights do not depend on it."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(raw_config, f, indent=1)
    config = ref.Config(raw_config)
    rng = np.random.default_rng(seed)
    block = config.weight_block_size
    tensors = {}

    def linear(name, rows, cols, quantizable=True):
        weight = rng.standard_normal((rows, cols)) / math.sqrt(cols)
        if linear_dtype == "F8_E4M3" and quantizable:
            codes, scale = quantize_fp8(weight, block)
            tensors[name + ".weight"] = ("F8_E4M3", codes)
            tensors[name + ".weight_scale_inv"] = ("F32", scale)
        else:
            tensors[name + ".weight"] = (linear_dtype if linear_dtype != "F8_E4M3" else "BF16", weight)

    def norm(name, size, dtype=None):
        tensors[name] = (dtype or norm_dtype, 1.0 + 0.1 * rng.standard_normal(size))

    def mlp(prefix, inner):
        linear(prefix + ".gate_proj", inner, config.hidden_size)
        linear(prefix + ".up_proj", inner, config.hidden_size)
        linear(prefix + ".down_proj", config.hidden_size, inner)

    hidden, heads = config.hidden_size, config.num_heads
    qk_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    embedding = rng.standard_normal((config.vocab_size, hidden))
    if tied_store:
        tensors[tied_store] = ("BF16", embedding)
    else:
        tensors["model.embed_tokens.weight"] = ("BF16", embedding)
        tensors["lm_head.weight"] = ("BF16", rng.standard_normal((config.vocab_size, hidden)) / math.sqrt(hidden))
    norm("model.norm.weight", hidden)
    for layer in range(config.num_layers + config.num_nextn_predict_layers):
        p = f"model.layers.{layer}."
        norm(p + "input_layernorm.weight", hidden)
        norm(p + "post_attention_layernorm.weight", hidden)
        a = p + "self_attn."
        if config.q_lora_rank is None:
            linear(a + "q_proj", heads * qk_dim, hidden)
        else:
            linear(a + "q_a_proj", config.q_lora_rank, hidden)
            norm(a + "q_a_layernorm.weight", config.q_lora_rank)
            linear(a + "q_b_proj", heads * qk_dim, config.q_lora_rank)
        linear(a + "kv_a_proj_with_mqa", config.kv_lora_rank + config.qk_rope_head_dim, hidden)
        norm(a + "kv_a_layernorm.weight", config.kv_lora_rank)
        linear(a + "kv_b_proj", heads * (config.qk_nope_head_dim + config.v_head_dim), config.kv_lora_rank)
        linear(a + "o_proj", hidden, heads * config.v_head_dim)
        if config.has_indexer and config.indexer_type(layer) == "full":
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
        tensors[p + "shared_head.head.weight"] = (
            "BF16",
            rng.standard_normal((config.vocab_size, hidden)) / math.sqrt(hidden),
        )

    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
        return
    weight_map = {}
    for shard in range(shards):
        file_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        write_safetensors(os.path.join(directory, file_name), {n: tensors[n] for n in part})
        weight_map.update({n: file_name for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def v3_config():
    return dict(BASE_CONFIG, model_type="deepseek_v3", q_lora_rank=None, rope_theta=10000.0, rope_scaling=YARN)


def v32_config():
    return dict(
        BASE_CONFIG,
        model_type="deepseek_v32",
        rope_theta=10000.0,
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 8]},
        **INDEXER,
    )


def glm_config():
    return dict(
        BASE_CONFIG,
        model_type="glm_moe_dsa",
        rms_norm_eps=1e-5,
        n_group=1,
        topk_group=1,
        tie_word_embeddings=True,
        rope_parameters={"rope_theta": 50000.0, "rope_type": "default"},
        rope_interleave=True,
        indexer_rope_interleave=True,
        mlp_layer_types=["dense", "dense", "sparse", "sparse"],
        index_topk_freq=2,
        index_skip_topk_offset=2,
        **INDEXER,
    )


# ---------------------------------------------------------------- helpers


def run(model_dir, tokens=TOKENS, dense_window=2051, attention="plain", index_topk=None):
    config, checkpoint = ref.load(model_dir)
    if index_topk is not None:
        config.index_topk = index_topk
    with torch.no_grad():
        return ref.Reference(config, checkpoint, dense_window, attention).forward(tokens)


def max_diff(a, b):
    return float((a - b).abs().max())


def complex_rope(vector, position, inv_freq, interleave):
    """Independent RoPE via complex numbers, as DeepSeek's apply_rotary_emb does."""
    d = len(vector)
    if interleave:
        pairs = [(vector[2 * i], vector[2 * i + 1]) for i in range(d // 2)]
    else:
        pairs = [(vector[i], vector[i + d // 2]) for i in range(d // 2)]
    turned = [complex(a, b) * cmath.exp(1j * position * float(inv_freq[i])) for i, (a, b) in enumerate(pairs)]
    if interleave:
        return [part for z in turned for part in (z.real, z.imag)]
    return [z.real for z in turned] + [z.imag for z in turned]


# ---------------------------------------------------------------- tests


def test_e4m3_table(_):
    table = ref.E4M3FN
    known = {0x00: 0.0, 0x01: 2.0**-9, 0x07: 7 * 2.0**-9, 0x08: 2.0**-6, 0x38: 1.0, 0x7E: 448.0, 0xB8: -1.0}
    for byte, value in known.items():
        assert table[byte] == value, (hex(byte), table[byte], value)
    assert math.isnan(table[0x7F]) and math.isnan(table[0xFF])
    assert table[0x80] == 0.0 and math.copysign(1.0, table[0x80]) < 0
    assert np.nanmax(table) == 448.0 and np.nanmin(table) == -448.0
    assert np.all(np.diff(table[:0x7F]) > 0)  # positive codes increase monotonically
    assert np.array_equal(table[0x80:0xFF], -table[:0x7F])


def test_safetensors_dtypes(tmp):
    rng = np.random.default_rng(1)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((4,)).astype(np.float16)
    bf16 = np.array([1.0, -2.5, 2.0**-15, 65280.0], dtype=np.float32)  # exactly representable in bf16
    codes = rng.integers(0, 256, size=(7, 5), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN in the weights
    scale = rng.uniform(0.5, 2.0, size=(2, 2)).astype(np.float32)  # 7x5 in blocks of 4x3
    directory = os.path.join(tmp, "dtypes")
    os.makedirs(directory)
    write_safetensors(
        os.path.join(directory, "model.safetensors"),
        {
            "a": ("F32", f32),
            "b": ("F16", f16),
            "c": ("BF16", bf16),
            "w": ("F8_E4M3", codes),
            "w_scale_inv": ("F32", scale),
        },
    )
    checkpoint = ref.Checkpoint(directory, (4, 3))
    assert np.array_equal(checkpoint.get("a").numpy(), f32.astype(np.float64))
    assert np.array_equal(checkpoint.get("b").numpy(), f16.astype(np.float64))
    assert np.array_equal(checkpoint.get("c").numpy(), bf16.astype(np.float64))
    got = checkpoint.get("w").numpy()
    for r in range(7):
        for c in range(5):
            assert got[r, c] == ref.E4M3FN[codes[r, c]] * float(scale[r // 4, c // 3]), (r, c)


def test_yarn_formulas(_):
    config = ref.Config(v3_config())
    # dim 8, base 1e4, original 16: correction dims beta_fast=32 -> -1.10 (floor, clamp: 0) and
    # beta_slow=1 -> 0.41 (ceil: 1), so pair 0 keeps its frequency and pairs 1..3 are divided by 4.
    base = [10000.0 ** (-2 * i / 8) for i in range(4)]
    expected = [base[0]] + [f / 4.0 for f in base[1:]]
    assert max(abs(a - b) for a, b in zip(config.inv_freq.tolist(), expected)) < 1e-15
    m, m_all = 0.1 * 0.9 * math.log(4) + 1, 0.1 * 0.7 * math.log(4) + 1
    assert abs(config.rope_attention_factor - m / m_all) < 1e-15
    assert abs(config.softmax_scale - 16**-0.5 * m_all * m_all) < 1e-15
    cos, sin = ref.rope_tables(config, 3)  # HF folds the attention factor into cos and sin
    assert max_diff(cos[2] ** 2 + sin[2] ** 2, torch.full((4,), (m / m_all) ** 2, dtype=torch.float64)) < 1e-14
    plain = ref.Config(dict(v3_config(), rope_scaling=None))
    assert plain.rope_attention_factor == 1.0 and plain.softmax_scale == 16**-0.5


def test_rope_conventions(_):
    rng = np.random.default_rng(2)
    inv_freq = torch.tensor([1.0, 0.3, 0.05, 0.01], dtype=torch.float64)
    positions = 9
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x = torch.from_numpy(rng.standard_normal((positions, 8)))
    for interleave in (True, False):
        got = ref.apply_rope(x, cos, sin, interleave)
        for p in range(positions):
            want = complex_rope(x[p].tolist(), p, inv_freq, interleave)
            assert max(abs(a - b) for a, b in zip(got[p].tolist(), want)) < 1e-14, (interleave, p)
    # Relative position: the same q and k vectors at (p, p - 3) score the same for every p.
    q = torch.from_numpy(rng.standard_normal(8)).expand(positions, 8)
    k = torch.from_numpy(rng.standard_normal(8)).expand(positions, 8)
    rq, rk = ref.apply_rope(q, cos, sin, True), ref.apply_rope(k, cos, sin, True)
    dots = [float(rq[p] @ rk[p - 3]) for p in range(3, positions)]
    assert max(dots) - min(dots) < 1e-12


def test_routing(_):
    raw = dict(BASE_CONFIG, model_type="deepseek_v3", rope_theta=1e4)
    config = ref.Config(raw)  # 8 experts, 4 groups of 2, keep 2 groups, 3 experts
    probs = torch.tensor([[0.9, 0.1, 0.6, 0.6, 0.8, 0.7, 0.2, 0.95]], dtype=torch.float64)
    logits = torch.log(probs / (1 - probs))  # sigmoid(logits) == probs
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5], dtype=torch.float64)
    # biased groups (top-2 sums): {0,1}: 1.0, {2,3}: 1.2, {4,5}: 1.5, {6,7}: 0.65 -> keep {4,5}, {2,3};
    # best three biased experts there: 4 (0.8), 5 (0.7), then 2 and 3 tie at 0.6 -> lower id 2.
    experts, weights = ref.route(logits, bias, config)
    assert experts.tolist() == [[4, 5, 2]], experts
    want = torch.tensor([0.8, 0.7, 0.6], dtype=torch.float64) / 2.1 * 2.5
    assert max_diff(weights[0], want) < 1e-14
    # All biased scores negative: experts of dropped groups must stay out (masked to -inf).
    experts, _ = ref.route(logits, bias - 1.0, config)
    assert experts.tolist() == [[4, 5, 2]], experts
    config.scoring_func, config.topk_method, config.norm_topk_prob = "softmax", "greedy", False
    experts, weights = ref.route(logits, bias, config)
    soft = logits.softmax(-1)[0]
    assert experts.tolist() == [[7, 0, 4]], experts
    assert max_diff(weights[0], soft[[7, 0, 4]] * 2.5) < 1e-14


def test_top_keys_ties(_):
    scores = torch.tensor([0.0, 2.0, 0.0, 1.0, 2.0, 0.0, 0.0], dtype=torch.float64)
    assert ref.top_keys(scores, 3).tolist() == [1, 3, 4]
    assert ref.top_keys(scores, 4).tolist() == [0, 1, 3, 4]  # first of the zeros
    assert ref.top_keys(scores, 6).tolist() == [0, 1, 2, 3, 4, 5]
    assert ref.top_keys(scores, 9).tolist() == list(range(7))


def _model_dirs(tmp):
    dirs = {
        "deepseek_v3": os.path.join(tmp, "v3"),
        "deepseek_v32": os.path.join(tmp, "v32"),
        "glm_moe_dsa": os.path.join(tmp, "glm"),
    }
    if not os.path.exists(dirs["deepseek_v3"]):
        make_checkpoint(dirs["deepseek_v3"], v3_config(), 10, "BF16", "F32")
        make_checkpoint(dirs["deepseek_v32"], v32_config(), 11, "F8_E4M3", "BF16", shards=2)
        make_checkpoint(dirs["glm_moe_dsa"], glm_config(), 12, "BF16", "F16", tied_store="lm_head.weight")
    return dirs


def test_absorbed_equals_plain(tmp):
    for model_type, directory in _model_dirs(tmp).items():
        plain, _ = run(directory, dense_window=4)
        absorbed, _ = run(directory, dense_window=4, attention="absorbed")
        assert torch.isfinite(plain).all()
        diff = max_diff(plain, absorbed)
        assert diff < 1e-10, (model_type, diff)


def test_causality(tmp):
    for model_type, directory in _model_dirs(tmp).items():
        full, _ = run(directory, dense_window=4)
        prefix, _ = run(directory, TOKENS[:9], dense_window=4)
        diff = max_diff(full[:9], prefix)
        assert diff < 1e-10, (model_type, diff)


def test_sparse_selection(tmp):
    dirs = _model_dirs(tmp)
    for model_type in ("deepseek_v32", "glm_moe_dsa"):
        directory = dirs[model_type]
        dense, dense_dump = run(directory, dense_window=len(TOKENS))
        assert all(selected == {} for selected in dense_dump)
        # Sparse path from the first position, but index_topk covers every key: same as dense.
        everything, _ = run(directory, dense_window=0, index_topk=len(TOKENS))
        assert max_diff(dense, everything) < 1e-12, model_type
        # A real selection: positions inside the window are unchanged, later ones differ.
        sparse, dump = run(directory, dense_window=4, index_topk=3)
        assert max_diff(dense[:4], sparse[:4]) < 1e-12, model_type
        assert all(max_diff(dense[p], sparse[p]) > 1e-6 for p in range(5, len(TOKENS))), model_type
        config, _ = ref.load(directory)
        for layer, selected in enumerate(dump):
            assert sorted(selected) == list(range(4, len(TOKENS))), (model_type, layer)
            for position, keys in selected.items():
                assert len(keys) == 3 and keys == sorted(keys) and keys[-1] <= position, (layer, position, keys)
            if config.indexer_types[layer] == "shared":
                assert selected == dump[layer - 1], (model_type, layer)
        if model_type == "glm_moe_dsa":
            assert config.indexer_types == ["full", "full", "shared", "full"], config.indexer_types


def test_indexer_scores_independent(tmp):
    """Layer 0's selection against a scalar re-implementation of the indexer score."""
    for model_type, directory in _model_dirs(tmp).items():
        if model_type == "deepseek_v3":
            continue
        config, checkpoint = ref.load(directory)
        _, dump = run(directory, dense_window=4, index_topk=3)

        def w(name):
            return checkpoint.get("model.layers.0." + name).tolist()

        def matvec(matrix, vector):
            return [sum(a * b for a, b in zip(row, vector)) for row in matrix]

        def rms(vector, weight, eps):
            scale = 1.0 / math.sqrt(sum(v * v for v in vector) / len(vector) + eps)
            return [v * scale * g for v, g in zip(vector, weight)]

        embedding = checkpoint.get("lm_head.weight" if config.tie_word_embeddings else "model.embed_tokens.weight")
        rope, heads, head_dim = config.qk_rope_head_dim, config.index_n_heads, config.index_head_dim
        keys, queries = [], []
        for p, token in enumerate(TOKENS):
            x = rms(embedding[token].tolist(), w("input_layernorm.weight"), config.rms_norm_eps)
            q_latent = rms(matvec(w("self_attn.q_a_proj.weight"), x), w("self_attn.q_a_layernorm.weight"), 1e-6)
            k = matvec(w("self_attn.indexer.wk.weight"), x)
            mean = sum(k) / len(k)
            var = sum((v - mean) ** 2 for v in k) / len(k)
            gamma, beta = w("self_attn.indexer.k_norm.weight"), w("self_attn.indexer.k_norm.bias")
            k = [(v - mean) / math.sqrt(var + 1e-6) * g + b for v, g, b in zip(k, gamma, beta)]
            keys.append(complex_rope(k[:rope], p, config.inv_freq, config.indexer_rope_interleave) + k[rope:])
            q_all = matvec(w("self_attn.indexer.wq_b.weight"), q_latent)
            q_heads = [q_all[h * head_dim : (h + 1) * head_dim] for h in range(heads)]
            head_weights = matvec(w("self_attn.indexer.weights_proj.weight"), x)
            queries.append(
                [
                    (complex_rope(q[:rope], p, config.inv_freq, config.indexer_rope_interleave) + q[rope:], hw)
                    for q, hw in zip(q_heads, head_weights)
                ]
            )
        for p in range(4, len(TOKENS)):
            scores = []
            for t in range(p + 1):
                score = 0.0
                for q, head_weight in queries[p]:
                    dot = sum(a * b for a, b in zip(q, keys[t]))
                    score += head_weight * heads**-0.5 * max(dot, 0.0) * head_dim**-0.5
                scores.append(score)
            want = sorted(sorted(range(p + 1), key=lambda t: (-scores[t], t))[:3])
            assert dump[0][p] == want, (model_type, p, dump[0][p], want)


def test_tied_embedding_either_name(tmp):
    lm_head_only = _model_dirs(tmp)["glm_moe_dsa"]
    embed_only = os.path.join(tmp, "glm_embed_only")
    make_checkpoint(embed_only, glm_config(), 12, "BF16", "F16", tied_store="model.embed_tokens.weight")
    a, _ = run(lm_head_only, dense_window=4)
    b, _ = run(embed_only, dense_window=4)
    assert torch.equal(a, b)


def test_command_line(tmp):
    directory = _model_dirs(tmp)["deepseek_v32"]
    out, dump_path = os.path.join(tmp, "logits.bin"), os.path.join(tmp, "topk.json")
    command = [
        sys.executable,
        os.path.join(HERE, "deepseek_reference.py"),
        "--model",
        directory,
        "--tokens",
        ",".join(map(str, TOKENS)),
        "--out",
        out,
        "--dense_window",
        "4",
        "--dump_topk",
        dump_path,
    ]
    subprocess.run(command, check=True)
    logits = np.fromfile(out, dtype="<f8")
    assert logits.size == len(TOKENS) * 64
    expected, dump = run(directory, dense_window=4)
    assert np.abs(logits.reshape(len(TOKENS), 64) - expected.numpy()).max() < 1e-12
    with open(dump_path) as f:
        written = json.load(f)
    assert written["dense_window"] == 4 and written["index_topk"] == 5
    assert [{int(p): s for p, s in layer["selected"].items()} for layer in written["layers"]] == dump
    assert [layer["indexer"] for layer in written["layers"]] == ["full"] * 4


# ---------------------------------------------------------------- multi-token prediction


def _mtp_dirs(tmp):
    """The three checkpoints of _model_dirs with the same seeds plus one MTP layer each."""
    dirs = {
        "deepseek_v3": os.path.join(tmp, "v3_mtp"),
        "deepseek_v32": os.path.join(tmp, "v32_mtp"),
        "glm_moe_dsa": os.path.join(tmp, "glm_mtp"),
    }
    if not os.path.exists(dirs["deepseek_v3"]):
        mtp = {"num_nextn_predict_layers": 1}
        make_checkpoint(dirs["deepseek_v3"], dict(v3_config(), **mtp), 10, "BF16", "F32")
        make_checkpoint(dirs["deepseek_v32"], dict(v32_config(), **mtp), 11, "F8_E4M3", "BF16", shards=2)
        make_checkpoint(
            dirs["glm_moe_dsa"], dict(glm_config(), **mtp), 12, "BF16", "F16", tied_store="lm_head.weight"
        )
    return dirs


def mtp_reference(model_dir, dense_window=2051, attention="plain", index_topk=None):
    config, checkpoint = ref.load(model_dir)
    if index_topk is not None:
        config.index_topk = index_topk
    return ref.Reference(config, checkpoint, dense_window, attention)


def test_mtp_layer_types(_):
    mtp = {"num_nextn_predict_layers": 1}
    # first_k_dense_replace applied to index num_hidden_layers (4).
    assert ref.Config(dict(v3_config(), **mtp)).mlp_type(4) == "sparse"
    assert ref.Config(dict(v3_config(), first_k_dense_replace=4, **mtp)).mlp_type(4) == "sparse"
    assert ref.Config(dict(v3_config(), first_k_dense_replace=5, **mtp)).mlp_type(4) == "dense"
    # A per-layer list names only the main layers; GLM-5's MTP layer is MoE even after dense ones.
    glm = dict(glm_config(), mlp_layer_types=["dense"] * 4, **mtp)
    assert ref.Config(glm).mlp_type(4) == "sparse"
    no_experts = {k: v for k, v in v3_config().items() if k != "n_routed_experts"}
    assert ref.Config(dict(no_experts, first_k_dense_replace=9, **mtp)).mlp_type(4) == "dense"
    # Layer 4 of this schedule would be shared (max(4 - 2 + 1, 0) % 2 == 1); the MTP's is full.
    five = dict(glm_config(), num_hidden_layers=5, mlp_layer_types=["dense"] + ["sparse"] * 4)
    assert ref.Config(five).indexer_types[4] == "shared"
    assert ref.Config(dict(glm_config(), **mtp)).indexer_type(4) == "full"
    assert ref.Config(glm_config()).num_nextn_predict_layers == 0


def test_mtp_leaves_main_model_alone(tmp):
    plain, mtp = _model_dirs(tmp), _mtp_dirs(tmp)
    for model_type in plain:
        a, _ = run(plain[model_type], dense_window=4)
        b, _ = run(mtp[model_type], dense_window=4)
        assert torch.equal(a, b), model_type


def test_mtp_independent(tmp):
    """The MTP input, written out per position: [enorm(embed(t_{j+1})), hnorm(h_j)] through
    eh_proj, embedding zeroed at position 0, h_j after model.norm; then the layer at index L
    and shared_head. Also shows that the other concat order and an unmasked position 0 would
    be caught."""
    for model_type, directory in _mtp_dirs(tmp).items():
        r = mtp_reference(directory, dense_window=4)
        config, checkpoint = r.config, r.checkpoint
        L, eps = config.num_layers, config.rms_norm_eps

        def w(name):
            return checkpoint.get(f"model.layers.{L}.{name}")

        def rms(vector, weight):
            return vector / math.sqrt(float((vector * vector).mean()) + eps) * weight

        with torch.no_grad():
            got = r.mtp_logits(TOKENS)
            main_logits, _ = r.forward(TOKENS)
            hidden, _ = r.hidden_states(TOKENS)
            head = checkpoint.get("lm_head.weight")  # stored in all three (glm: tied, lm_head only)
            # Post-norm: the head applied to these states is the model's output, and divided by
            # model.norm's weight each row has unit RMS (up to eps).
            assert max_diff(hidden @ head.T, main_logits) < 1e-12, model_type
            unit = (hidden / checkpoint.get("model.norm.weight")).pow(2).mean(-1)
            assert max_diff(unit, torch.ones_like(unit)) < 1e-4, (model_type, unit)
            embedding = head if config.tie_word_embeddings else checkpoint.get("model.embed_tokens.weight")
            positions = len(TOKENS) - 1
            cos, sin = ref.rope_tables(config, positions)

            def mtp(order, mask):
                rows = []
                for j in range(positions):
                    e = embedding[TOKENS[j + 1]] * (0.0 if j == 0 and mask else 1.0)
                    parts = {"e": rms(e, w("enorm.weight")), "h": rms(hidden[j], w("hnorm.weight"))}
                    rows.append(w("eh_proj.weight") @ torch.cat([parts[c] for c in order]))
                y, _ = r._decoder_layer(L, torch.stack(rows), cos, sin, None)
                normed = torch.stack([rms(row, w("shared_head.norm.weight")) for row in y])
                return normed @ w("shared_head.head.weight").T

            want = mtp("eh", mask=True)
            assert got.shape == (positions, config.vocab_size)
            assert max_diff(got, want) < 1e-12, (model_type, max_diff(got, want))
            assert max_diff(got, mtp("he", mask=True)) > 1e-3, model_type
            unmasked = mtp("eh", mask=False)
            assert float((got[0] - unmasked[0]).abs().max()) > 1e-3, model_type


def test_mtp_position_zero_ignores_its_token(tmp):
    for model_type, directory in _mtp_dirs(tmp).items():
        r = mtp_reference(directory, dense_window=4)
        changed = list(TOKENS)
        changed[1] = (changed[1] + 1) % 64
        with torch.no_grad():
            a, b = r.mtp_logits(TOKENS), r.mtp_logits(changed)
        assert torch.equal(a[0], b[0]), model_type  # h_0 sees t_0 only, and e_0 is masked
        assert all(float((a[j] - b[j]).abs().max()) > 1e-6 for j in range(1, len(TOKENS) - 1)), model_type


def test_mtp_causal_absorbed_and_own_indexer(tmp):
    for model_type, directory in _mtp_dirs(tmp).items():
        r = mtp_reference(directory, dense_window=4, index_topk=3)
        with torch.no_grad():
            full, selection = r.mtp_forward(TOKENS)
            prefix = r.mtp_logits(TOKENS[:9])
            absorbed = mtp_reference(directory, 4, "absorbed", index_topk=3).mtp_logits(TOKENS)
            dense = mtp_reference(directory, dense_window=len(TOKENS)).mtp_logits(TOKENS)
        assert max_diff(full[:8], prefix) < 1e-10, model_type
        assert max_diff(full, absorbed) < 1e-10, model_type
        if model_type == "deepseek_v3":
            assert selection == {} and max_diff(full, dense) < 1e-10
            continue
        # Its own top-3 past the window (index 4 would be a shared layer in glm's schedule).
        assert sorted(selection) == list(range(4, len(TOKENS) - 1)), (model_type, selection)
        for position, keys in selection.items():
            assert len(keys) == 3 and keys == sorted(keys) and keys[-1] <= position, (position, keys)
        assert max_diff(full[:4], dense[:4]) < 1e-12, model_type
        assert all(max_diff(full[p], dense[p]) > 1e-6 for p in range(5, len(TOKENS) - 1)), model_type


def test_mtp_first_draft_is_teacher_forced(tmp):
    for model_type, directory in _mtp_dirs(tmp).items():
        r = mtp_reference(directory, dense_window=4)
        for n in (1, 6, len(TOKENS) - 1):
            with torch.no_grad():
                drafts, step_logits = r.mtp_draft_steps(TOKENS[:n], TOKENS[n], 1)
                teacher = r.mtp_logits(TOKENS[: n + 1])
            assert max_diff(step_logits[0], teacher[n - 1]) < 1e-12, (model_type, n)
            assert drafts == [int(teacher[n - 1].argmax())], (model_type, n)


def test_mtp_recursion_feeds_its_own_hidden(tmp):
    """Step 2's hidden input is the MTP's own y at position n-1 (before shared_head.norm), not
    the main model's h_n nor the normed y."""
    n = 6
    for model_type, directory in _mtp_dirs(tmp).items():
        r = mtp_reference(directory, dense_window=4)
        s = TOKENS[n]
        with torch.no_grad():
            drafts, step_logits = r.mtp_draft_steps(TOKENS[:n], s, 3)
            assert drafts == [int(row.argmax()) for row in step_logits] and len(drafts) == 3
            assert r.mtp_draft(TOKENS[:n], s, 3) == drafts
            hidden, _ = r.hidden_states(TOKENS[:n])
            inputs = TOKENS[1:n] + [s, drafts[0]]
            y1, _ = r._mtp_layer(hidden, TOKENS[1:n] + [s])

            def step2(last_hidden):
                y2, _ = r._mtp_layer(torch.cat((hidden, last_hidden[None])), inputs)
                return r._mtp_head(y2[-1:])[0]

            assert max_diff(step2(y1[-1]), step_logits[1]) < 1e-12, model_type
            main_next, _ = r.hidden_states(TOKENS[:n] + [s])
            assert max_diff(step2(main_next[-1]), step_logits[1]) > 1e-3, model_type
            prefix = f"model.layers.{r.config.num_layers}."
            normed = ref.rms_norm(
                y1[-1], r.checkpoint.get(prefix + "shared_head.norm.weight"), r.config.rms_norm_eps
            )
            assert max_diff(step2(normed), step_logits[1]) > 1e-6, model_type
            # Step 3 appends y at position n from step 2 and draft 2.
            y2, _ = r._mtp_layer(torch.cat((hidden, y1[-1:])), inputs)
            y3, _ = r._mtp_layer(torch.cat((hidden, y1[-1:], y2[-1:])), inputs + [drafts[1]])
            assert max_diff(r._mtp_head(y3[-1:])[0], step_logits[2]) < 1e-12, model_type


def test_mtp_shared_head_falls_back_to_lm_head(tmp):
    r = mtp_reference(_mtp_dirs(tmp)["deepseek_v3"], dense_window=4)
    name = f"model.layers.{r.config.num_layers}.shared_head.head.weight"
    with torch.no_grad():
        own = r.mtp_logits(TOKENS)
        hidden, _ = r.hidden_states(TOKENS)
        y, _ = r._mtp_layer(hidden[:-1], TOKENS[1:])
        normed = ref.rms_norm(
            y, r.checkpoint.get(name.replace("head.weight", "norm.weight")), r.config.rms_norm_eps
        )
        assert max_diff(own, normed @ r.checkpoint.get(name).T) < 1e-12
        del r.checkpoint.entries[name]
        fallback = r.mtp_logits(TOKENS)
    assert max_diff(fallback, normed @ r.checkpoint.get("lm_head.weight").T) < 1e-12
    assert max_diff(fallback, own) > 1e-3


def test_mtp_refused_without_the_layer(tmp):
    r = mtp_reference(_model_dirs(tmp)["deepseek_v3"])
    for call in (lambda: r.mtp_logits(TOKENS), lambda: r.mtp_draft(TOKENS, 1, 2)):
        try:
            call()
        except SystemExit as e:
            assert "num_nextn_predict_layers" in str(e), e
        else:
            raise AssertionError("an MTP call on a checkpoint without an MTP layer returned")
    r.config.num_nextn_predict_layers = 1  # declared, but no tensors
    try:
        r.mtp_logits(TOKENS)
    except SystemExit as e:
        assert "eh_proj" in str(e), e
    else:
        raise AssertionError("an MTP call without eh_proj returned")
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "deepseek_reference.py"),
            "--model",
            _model_dirs(tmp)["deepseek_v3"],
            "--tokens",
            "1,2,3",
            "--out",
            os.path.join(tmp, "unused.bin"),
            "--mtp_out",
            os.path.join(tmp, "unused_mtp.bin"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "no MTP layer" in result.stderr, result


def test_mtp_command_line(tmp):
    directory = _mtp_dirs(tmp)["deepseek_v32"]
    out, mtp_out = os.path.join(tmp, "main.bin"), os.path.join(tmp, "mtp.bin")
    dump_path, draft_path = os.path.join(tmp, "mtp_topk.json"), os.path.join(tmp, "drafts.json")
    script = os.path.join(HERE, "deepseek_reference.py")
    tokens = ",".join(map(str, TOKENS))
    common = [sys.executable, script, "--model", directory, "--tokens", tokens, "--dense_window", "4"]
    subprocess.run(common + ["--out", out, "--mtp_out", mtp_out, "--dump_topk", dump_path], check=True)
    r = mtp_reference(directory, dense_window=4)
    with torch.no_grad():
        expected, selection = r.mtp_forward(TOKENS)
        drafts = r.mtp_draft(TOKENS, 7, 3)
    written = np.fromfile(mtp_out, dtype="<f8").reshape(len(TOKENS) - 1, 64)
    assert np.abs(written - expected.numpy()).max() < 1e-12
    assert np.fromfile(out, dtype="<f8").size == len(TOKENS) * 64
    with open(dump_path) as f:
        mtp_dump = json.load(f)["mtp"]
    assert mtp_dump["layer"] == 4 and mtp_dump["indexer"] == "full"
    assert {int(p): s for p, s in mtp_dump["selected"].items()} == selection
    draft_args = ["--mtp_draft", "3", "--mtp_next", "7", "--mtp_draft_out", draft_path]
    result = subprocess.run(common + ["--out", out] + draft_args, check=True, capture_output=True, text=True)
    assert json.loads(result.stdout) == {"drafts": drafts}, result.stdout
    with open(draft_path) as f:
        assert json.load(f) == {"drafts": drafts}
    bad = subprocess.run(common + ["--out", out, "--mtp_draft", "2"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--mtp_next" in bad.stderr, bad


TESTS = [
    test_e4m3_table,
    test_safetensors_dtypes,
    test_yarn_formulas,
    test_rope_conventions,
    test_routing,
    test_top_keys_ties,
    test_absorbed_equals_plain,
    test_causality,
    test_sparse_selection,
    test_indexer_scores_independent,
    test_tied_embedding_either_name,
    test_command_line,
    test_mtp_layer_types,
    test_mtp_leaves_main_model_alone,
    test_mtp_independent,
    test_mtp_position_zero_ignores_its_token,
    test_mtp_causal_absorbed_and_own_indexer,
    test_mtp_first_draft_is_teacher_forced,
    test_mtp_recursion_feeds_its_own_hidden,
    test_mtp_shared_head_falls_back_to_lm_head,
    test_mtp_refused_without_the_layer,
    test_mtp_command_line,
]


def run_tests(tests):
    """Runs each test(tmp_dir), reports every failure, returns the exit code (also used by
    glm5_next_reference_selftest.py)."""
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for test in tests:
            try:
                test(tmp)
            except (Exception, SystemExit):  # the reference exits on bad input; report every failure
                failed += 1
                print(f"FAIL {test.__name__}")
                traceback.print_exc(file=sys.stdout)
            else:
                passed += 1
                print(f"ok   {test.__name__}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    return run_tests(TESTS)


if __name__ == "__main__":
    sys.exit(main())
