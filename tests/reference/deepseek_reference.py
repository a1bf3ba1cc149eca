#!/usr/bin/python3
"""Float64 reference forward pass for DeepSeek-V3, DeepSeek-V3.2 and GLM-5 (glm_moe_dsa).

Written from the published architecture (Hugging Face transformers' deepseek_v3,
deepseek_v32 and glm_moe_dsa modeling/configuration files, and DeepSeek's inference
model.py), independently of the C++ engine, so that the engine's logits can be checked
against it. Everything runs in torch.float64 with every weight dequantized to float64;
see tests/reference/README.md for the conventions and where the published sources differ.

    deepseek_reference.py --model DIR --tokens 1,5,7 --out FILE
                          [--dense_window N] [--dump_topk FILE]
                          [--mtp_out FILE] [--mtp_draft K --mtp_next S [--mtp_draft_out FILE]]

The whole token sequence runs as one causal prefill (teacher forcing) and the logits of
every position are written as raw little-endian float64, shape [T][vocab_size].
--mtp_out also writes the MTP layer's teacher-forced logits, shape [T-1][vocab_size] (row j
predicts token j+2). --mtp_draft K treats --tokens as a prefix and --mtp_next as the main
model's next token, and prints {"drafts": [K greedy MTP drafts]} as JSON.
A glm5_next checkpoint (KDA + MLA hybrid) is handed to glm5_next_reference.py with the same
arguments, which also takes --kda_chunk C.
"""

import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np
import torch

SUPPORTED_MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")

# HF builds q_a_layernorm / kv_a_layernorm without passing rms_norm_eps (DeepseekV3Attention,
# GlmMoeDsaAttention), and DeepSeek's model.py uses 1e-6 for every RMSNorm, so the two latent
# norms use 1e-6 whatever rms_norm_eps says. The indexer's k_norm is a LayerNorm with 1e-6 too.
LATENT_NORM_EPS = 1e-6
INDEXER_NORM_EPS = 1e-6

# Attention and indexer logits are built a block of query rows at a time; this bounds one
# block to about 2**24 float64 values (128 MiB) whatever the sequence length.
BLOCK_ELEMENTS = 1 << 24


def _e4m3fn_table():
    """All 256 float8_e4m3fn values: bias 7, no infinities, S.1111.111 is NaN."""
    table = np.empty(256, dtype=np.float64)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent = (byte >> 3) & 0xF
        mantissa = byte & 0x7
        if exponent == 0xF and mantissa == 0x7:
            table[byte] = np.nan
        elif exponent == 0:
            table[byte] = sign * mantissa * 2.0 ** -9  # subnormal: 0.mmm * 2^(1-7)
        else:
            table[byte] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return table


E4M3FN = _e4m3fn_table()


class Checkpoint:
    """Lazy reader of a Hugging Face safetensors directory (one file or shards + index)."""

    def __init__(self, model_dir, block_size=(128, 128)):
        self.block_size = tuple(block_size)
        self.entries = {}  # tensor name -> (path, dtype, shape, first byte, end byte)
        index_path = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            raise SystemExit(f"no .safetensors files in {model_dir}")
        for file_name in files:
            path = os.path.join(model_dir, file_name)
            with open(path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
            data_start = 8 + header_len
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                self.entries[name] = (path, info["dtype"], info["shape"], data_start + begin, data_start + end)

    def __contains__(self, name):
        return name in self.entries

    def _raw(self, name):
        path, dtype, shape, begin, end = self.entries[name]
        with open(path, "rb") as f:
            f.seek(begin)
            data = f.read(end - begin)
        if dtype == "F64":
            values = np.frombuffer(data, "<f8")
        elif dtype == "F32":
            values = np.frombuffer(data, "<f4")
        elif dtype == "F16":
            values = np.frombuffer(data, "<f2")
        elif dtype == "BF16":
            # bfloat16 is the top half of a float32.
            values = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F8_E4M3":
            values = E4M3FN[np.frombuffer(data, np.uint8)]
        else:
            raise SystemExit(f"tensor {name}: unsupported dtype {dtype}")
        return torch.from_numpy(values.astype(np.float64).reshape(shape))

    def get(self, name):
        """The tensor as float64; FP8 weights are multiplied by their block scale_inv."""
        if name not in self.entries:
            raise SystemExit(f"tensor {name} is not in the checkpoint")
        value = self._raw(name)
        if self.entries[name][1] != "F8_E4M3":
            return value
        scale_name = name + "_scale_inv"
        if scale_name not in self.entries:
            raise SystemExit(f"FP8 tensor {name} has no {scale_name}")
        scale = self._raw(scale_name)
        rows, cols = value.shape
        block_rows, block_cols = self.block_size
        expected = (-(-rows // block_rows), -(-cols // block_cols))
        if tuple(scale.shape) != expected:
            raise SystemExit(f"{scale_name}: shape {list(scale.shape)}, expected {list(expected)}")
        scale = scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]
        return value * scale


def yarn_mscale(factor, mscale):
    """DeepSeek's YaRN magnitude correction (yarn_get_mscale in HF deepseek_v3)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


class Config:
    """The config.json keys the forward pass depends on, with the published defaults."""

    def __init__(self, raw):
        self.model_type = raw.get("model_type")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise SystemExit(f"model_type {self.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
        if raw.get("hidden_act", "silu") != "silu":
            raise SystemExit(f"hidden_act {raw['hidden_act']!r}: only silu is implemented")
        self.hidden_size = raw["hidden_size"]
        self.num_layers = raw["num_hidden_layers"]
        self.num_heads = raw["num_attention_heads"]
        self.vocab_size = raw["vocab_size"]
        self.rms_norm_eps = raw["rms_norm_eps"]
        self.tie_word_embeddings = bool(raw.get("tie_word_embeddings", False))
        self.q_lora_rank = raw.get("q_lora_rank")
        self.kv_lora_rank = raw["kv_lora_rank"]
        self.qk_nope_head_dim = raw["qk_nope_head_dim"]
        self.qk_rope_head_dim = raw["qk_rope_head_dim"]
        self.v_head_dim = raw["v_head_dim"]
        self.rope_interleave = bool(raw.get("rope_interleave", True))
        self._parse_rope(raw)
        # DeepSeek-V3 / GLM-5 store one MTP layer at index num_hidden_layers; only that one
        # is implemented (mtp_* refuse other counts, plain forward ignores the layer).
        self.num_nextn_predict_layers = int(raw.get("num_nextn_predict_layers") or 0)
        self._parse_mlp(raw)
        self.has_indexer = self.model_type != "deepseek_v3"
        if self.has_indexer:
            self._parse_indexer(raw)
        quantization = raw.get("quantization_config") or {}
        self.weight_block_size = tuple(quantization.get("weight_block_size") or (128, 128))

    def _parse_rope(self, raw):
        # glm_moe_dsa (and newer HF configs) nest rope_theta and the scaling fields in
        # rope_parameters; older deepseek configs use top-level rope_theta plus rope_scaling.
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        self.rope_theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        dim = self.qk_rope_head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        self.inv_freq = 1.0 / self.rope_theta ** exponents
        self.rope_attention_factor = 1.0
        self.softmax_scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        if rope_type == "default":
            return
        if rope_type != "yarn":
            raise SystemExit(f"rope type {rope_type!r}: only default and yarn are implemented")
        factor = float(rope["factor"])
        original_max = rope.get("original_max_position_embeddings") or raw["max_position_embeddings"]
        beta_fast = rope.get("beta_fast") or 32
        beta_slow = rope.get("beta_slow") or 1
        mscale = rope.get("mscale")
        mscale_all_dim = rope.get("mscale_all_dim")

        def correction_dim(rotations):
            # The rotary pair index whose wavelength fits `rotations` times into original_max.
            return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(self.rope_theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        # ramp 0: high-frequency pairs keep their frequency (extrapolation); ramp 1: low-frequency
        # pairs are divided by factor (interpolation); linear in between.
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        self.inv_freq = self.inv_freq / factor * ramp + self.inv_freq * (1 - ramp)
        # HF multiplies cos and sin by an attention factor (_compute_yarn_parameters): 1 for
        # DeepSeek-V3, whose mscale equals mscale_all_dim.
        attention_factor = rope.get("attention_factor")
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = yarn_mscale(factor, 1.0)
        self.rope_attention_factor = float(attention_factor)
        # DeepSeek multiplies the softmax scale by mscale^2 (MLA.__init__ in model.py,
        # DeepseekV3Attention in HF, which reads mscale_all_dim).
        if mscale_all_dim:
            self.softmax_scale *= yarn_mscale(factor, mscale_all_dim) ** 2

    def _parse_mlp(self, raw):
        if raw.get("moe_layer_freq", 1) != 1:
            raise SystemExit("moe_layer_freq other than 1 is not implemented")
        types = raw.get("mlp_layer_types")
        if types is None:
            dense = min(raw.get("first_k_dense_replace", 3), self.num_layers)
            types = ["dense"] * dense + ["sparse"] * (self.num_layers - dense)
        if len(types) < self.num_layers or any(t not in ("dense", "sparse") for t in types):
            raise SystemExit(f"mlp_layer_types {types!r} is not a dense/sparse list per layer")
        self.mlp_layer_types = list(types[: self.num_layers])
        # The MTP layer takes the first_k_dense_replace rule at its own index, as vLLM's and
        # SGLang's decoder layers do; an mlp_layer_types list names only the main layers, and
        # GLM-5's MTP layer past it is MoE. Without routed experts every layer is dense.
        self.mtp_mlp_type = None
        if self.num_nextn_predict_layers:
            if not raw.get("n_routed_experts"):
                self.mtp_mlp_type = "dense"
            elif raw.get("mlp_layer_types") is not None:
                self.mtp_mlp_type = "sparse"
            else:
                dense = raw.get("first_k_dense_replace", 3)
                self.mtp_mlp_type = "sparse" if self.num_layers >= dense else "dense"
        self.intermediate_size = raw.get("intermediate_size")
        if "sparse" not in self.mlp_layer_types and self.mtp_mlp_type != "sparse":
            return
        self.moe_intermediate_size = raw["moe_intermediate_size"]
        self.n_routed_experts = raw["n_routed_experts"]
        self.n_shared_experts = raw.get("n_shared_experts") or 0
        self.num_experts_per_tok = raw["num_experts_per_tok"]
        self.n_group = raw.get("n_group") or 1
        self.topk_group = raw.get("topk_group") or 1
        self.routed_scaling_factor = float(raw.get("routed_scaling_factor", 1.0))
        self.scoring_func = raw.get("scoring_func", "sigmoid")
        self.topk_method = raw.get("topk_method", "noaux_tc")
        self.norm_topk_prob = bool(raw.get("norm_topk_prob", True))
        if self.scoring_func not in ("sigmoid", "softmax"):
            raise SystemExit(f"scoring_func {self.scoring_func!r} is not implemented")
        if self.topk_method not in ("noaux_tc", "greedy", "group_limited_greedy"):
            raise SystemExit(f"topk_method {self.topk_method!r} is not implemented")

    def _parse_indexer(self, raw):
        if self.q_lora_rank is None:
            raise SystemExit("the DSA indexer reads the q latent: q_lora_rank must not be null")
        self.index_topk = raw["index_topk"]
        self.index_n_heads = raw["index_n_heads"]
        self.index_head_dim = raw["index_head_dim"]
        # DeepSeek-V3.2's indexer rotates split halves (Indexer.forward: "rope in indexer is not
        # interleaved"); GLM-5 configs say indexer_rope_interleave: true and HF's glm_moe_dsa
        # rotates adjacent pairs there.
        default_interleave = self.model_type == "glm_moe_dsa"
        self.indexer_rope_interleave = bool(raw.get("indexer_rope_interleave", default_interleave))
        # GLM-5.2 index sharing (GlmMoeDsaConfig.__post_init__): an explicit indexer_types list,
        # else index_topk_pattern ("F"/"S" per layer), else full where
        # max(layer - index_skip_topk_offset + 1, 0) % index_topk_freq == 0.
        types = raw.get("indexer_types")
        if types is None and raw.get("index_topk_pattern") is not None:
            pattern = raw["index_topk_pattern"]
            types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else pattern
        if types is None:
            freq = max(raw.get("index_topk_freq") or 1, 1)
            offset = raw.get("index_skip_topk_offset")
            offset = 2 if offset is None else offset
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(self.num_layers)]
        types = list(types[: self.num_layers])
        if len(types) < self.num_layers or any(t not in ("full", "shared") for t in types) or types[0] != "full":
            raise SystemExit(f"indexer_types {types!r}: full/shared per layer, starting with full")
        self.indexer_types = types

    def mlp_type(self, layer):
        """"dense" or "sparse" for a main layer or the MTP layer (index num_layers)."""
        return self.mlp_layer_types[layer] if layer < self.num_layers else self.mtp_mlp_type

    def indexer_type(self, layer):
        """"full" or "shared"; the MTP layer always runs its own indexer."""
        return self.indexer_types[layer] if layer < self.num_layers else "full"


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def layer_norm(x, weight, bias, eps):
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps) * weight + bias


def rope_tables(config, num_positions):
    """cos and sin [T, rope_dim/2] for positions 0..T-1, with HF's attention factor folded in."""
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * config.inv_freq[None, :]
    factor = config.rope_attention_factor
    return angles.cos() * factor, angles.sin() * factor


def apply_rope(x, cos, sin, interleave):
    """Rotate x [T, ..., d] by position. Pair i is (x[2i], x[2i+1]) when interleaved (DeepSeek's
    complex view, GPT-J) and (x[i], x[i + d/2]) otherwise (NeoX); pair i turns by angle
    position * inv_freq[i]. The output keeps the input's layout."""
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[-1]]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleave:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
    rotated_a, rotated_b = a * cos - b * sin, a * sin + b * cos
    if interleave:
        return torch.stack((rotated_a, rotated_b), dim=-1).flatten(-2)
    return torch.cat((rotated_a, rotated_b), dim=-1)


def route(router_logits, correction_bias, config):
    """MoE routing as published: returns expert ids and weights [T, num_experts_per_tok].

    Experts are chosen by the (bias-corrected, for noaux_tc) scores inside the topk_group best
    groups, and weighted by the uncorrected scores."""
    if config.scoring_func == "sigmoid":
        scores = router_logits.sigmoid()
    else:
        scores = router_logits.softmax(-1)
    choice = scores + correction_bias if config.topk_method == "noaux_tc" else scores
    if config.topk_method != "greedy":
        tokens = choice.shape[0]
        grouped = choice.view(tokens, config.n_group, -1)
        if config.topk_method == "noaux_tc":
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        else:
            group_scores = grouped.amax(-1)
        kept = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, : config.topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        choice = grouped.masked_fill(~group_mask[..., None], -math.inf).view(tokens, -1)
    experts = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, : config.num_experts_per_tok]
    weights = scores.gather(1, experts)
    if config.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return experts, weights * config.routed_scaling_factor


def top_keys(scores, k):
    """Positions of the k highest scores, ascending; equal scores prefer the lower position
    (a stable descending sort keeps position order among equals)."""
    ranked = torch.sort(scores, descending=True, stable=True).indices[:k]
    return torch.sort(ranked).values


def _row_block(heads, keys):
    return max(1, BLOCK_ELEMENTS // max(1, heads * keys))


def mla_attention(q_nope, q_pe, latent, k_pe, kv_b, allowed, scale, absorbed):
    """Multi-head latent attention over the keys `allowed` [T, T] lets each query see.

    q_nope [T, H, nope], q_pe [T, H, rope], latent [T, kv_lora_rank] (after kv_a_layernorm),
    k_pe [T, rope] (shared by all heads), kv_b [H, nope + v, kv_lora_rank]. The plain form
    expands per-head keys and values through kv_b; the absorbed form folds kv_b into the query
    and the output and attends over the latent itself. Returns [T, H, v]."""
    tokens, heads, nope = q_nope.shape
    w_k, w_v = kv_b[:, :nope], kv_b[:, nope:]
    if absorbed:
        q_latent = torch.einsum("shd,hdr->shr", q_nope, w_k)
    else:
        k_nope = torch.einsum("tr,hdr->thd", latent, w_k)
        values = torch.einsum("tr,hdr->thd", latent, w_v)
    out = torch.empty(tokens, heads, w_v.shape[1], dtype=torch.float64)
    step = _row_block(heads, tokens)
    for start in range(0, tokens, step):
        stop = min(tokens, start + step)  # causal: these queries see keys < stop only
        rope_part = torch.einsum("shr,tr->hst", q_pe[start:stop], k_pe[:stop])
        if absorbed:
            logits = torch.einsum("shr,tr->hst", q_latent[start:stop], latent[:stop]) + rope_part
        else:
            logits = torch.einsum("shd,thd->hst", q_nope[start:stop], k_nope[:stop]) + rope_part
        logits = (logits * scale).masked_fill(~allowed[start:stop, :stop], -math.inf)
        probs = logits.softmax(-1)
        if absorbed:
            context = torch.einsum("hst,tr->shr", probs, latent[:stop])
            out[start:stop] = torch.einsum("shr,hdr->shd", context, w_v)
        else:
            out[start:stop] = torch.einsum("hst,thd->shd", probs, values[:stop])
    return out


class Reference:
    """Float64 forward pass. attention is "plain" (per-head K/V) or "absorbed" (latent)."""

    def __init__(self, config, checkpoint, dense_window=2051, attention="plain"):
        self.config = config
        self.checkpoint = checkpoint
        self.dense_window = dense_window
        self.absorbed = attention == "absorbed"

    def _weight(self, name):
        return self.checkpoint.get(name)

    def _linear(self, prefix, x):
        y = x @ self._weight(prefix + ".weight").T
        if prefix + ".bias" in self.checkpoint:  # only with attention_bias
            y = y + self._weight(prefix + ".bias")
        return y

    def _embedding_and_head(self):
        # Tied checkpoints store one of the two; either serves both roles.
        names = ("model.embed_tokens.weight", "lm_head.weight")
        if self.config.tie_word_embeddings:
            stored = next((n for n in names if n in self.checkpoint), names[0])
            return stored, stored
        return names

    def forward(self, tokens):
        """Logits [T, vocab] and, per layer, {position: sorted selected keys} beyond the window."""
        hidden, selections = self.hidden_states(tokens)
        return hidden @ self._weight(self._embedding_and_head()[1]).T, selections

    def hidden_states(self, tokens):
        """The main model's final hidden states [T, hidden], after model.norm (what vLLM and
        SGLang hand the MTP layer as previous_hidden_states), and the per-layer selections."""
        config = self.config
        token_ids = torch.tensor(tokens, dtype=torch.long)
        hidden = self._weight(self._embedding_and_head()[0])[token_ids]
        cos, sin = rope_tables(config, len(tokens))
        selection = None  # (allowed mask, dump) of the previous layer: what a shared layer reuses
        selections = []
        for layer in range(config.num_layers):
            hidden, selection = self._decoder_layer(layer, hidden, cos, sin, selection)
            selections.append(selection[1])
        return rms_norm(hidden, self._weight("model.norm.weight"), config.rms_norm_eps), selections

    def _decoder_layer(self, layer, hidden, cos, sin, previous_selection):
        """model.layers.{layer}: pre-norm attention and pre-norm MLP/MoE, each added to the
        residual stream `hidden` [T, hidden]. Returns the new stream and the layer's selection."""
        config = self.config
        prefix = f"model.layers.{layer}."
        x = rms_norm(hidden, self._weight(prefix + "input_layernorm.weight"), config.rms_norm_eps)
        attention_out, selection = self._attention(layer, x, cos, sin, previous_selection)
        hidden = hidden + attention_out
        x = rms_norm(hidden, self._weight(prefix + "post_attention_layernorm.weight"), config.rms_norm_eps)
        if config.mlp_type(layer) == "sparse":
            return hidden + self._moe(prefix + "mlp", x), selection
        return hidden + self._mlp(prefix + "mlp", x), selection

    # ------------------------------------------------------------ multi-token prediction

    def _mtp_prefix(self):
        config = self.config
        if config.num_nextn_predict_layers == 0:
            raise SystemExit("this checkpoint has no MTP layer: config.json's num_nextn_predict_layers is 0 or absent")
        if config.num_nextn_predict_layers != 1:
            raise SystemExit(f"num_nextn_predict_layers {config.num_nextn_predict_layers}: only 1 is implemented")
        prefix = f"model.layers.{config.num_layers}."
        if prefix + "eh_proj.weight" not in self.checkpoint:
            raise SystemExit(f"config.json declares an MTP layer but {prefix}eh_proj.weight is not in the checkpoint")
        return prefix

    def _mtp_layer(self, previous_hidden, input_tokens):
        """The MTP layer's residual stream y [P, hidden] (no final norm) at positions 0..P-1,
        and its selection. Position j combines previous_hidden[j] (the main model's post-norm
        h_j, or the MTP's own earlier y) with the embedding of input_tokens[j], the token
        after position j."""
        config = self.config
        prefix = self._mtp_prefix()
        eps = config.rms_norm_eps
        # vLLM masks the MTP's input embedding at position 0 (DeepSeekMultiTokenPredictorLayer);
        # the embedding is the main model's, not the optional copy under the MTP prefix.
        embeds = self._weight(self._embedding_and_head()[0])[torch.tensor(input_tokens, dtype=torch.long)]
        embeds[0] = 0.0
        combined = torch.cat(
            (
                rms_norm(embeds, self._weight(prefix + "enorm.weight"), eps),
                rms_norm(previous_hidden, self._weight(prefix + "hnorm.weight"), eps),
            ),
            dim=-1,
        )
        x = self._linear(prefix + "eh_proj", combined)
        cos, sin = rope_tables(config, x.shape[0])
        return self._decoder_layer(config.num_layers, x, cos, sin, None)

    def _mtp_head(self, y):
        prefix = self._mtp_prefix()
        head = prefix + "shared_head.head.weight"
        if head not in self.checkpoint:
            head = self._embedding_and_head()[1]
        normed = rms_norm(y, self._weight(prefix + "shared_head.norm.weight"), self.config.rms_norm_eps)
        return normed @ self._weight(head).T

    def mtp_forward(self, tokens):
        """Teacher-forced MTP logits [T-1, vocab] (row j: the distribution of token j+2) and the
        MTP layer's {position: selected keys} beyond the dense window."""
        if len(tokens) < 2:
            raise SystemExit("the MTP needs at least two tokens (row j predicts token j+2)")
        hidden, _ = self.hidden_states(tokens)
        y, selection = self._mtp_layer(hidden[:-1], tokens[1:])
        return self._mtp_head(y), selection[1]

    def mtp_logits(self, tokens):
        return self.mtp_forward(tokens)[0]

    def mtp_draft_steps(self, tokens, next_token, k):
        """Greedy recursive drafting with one MTP layer, as vLLM runs it for k speculative
        tokens. tokens is the prefix t_0..t_{n-1}, next_token the main model's t_n. Step 1 runs
        positions 0..n-1 on (h_j, t_{j+1}); each later step appends one position whose inputs
        are the MTP's own previous output y (pre shared_head.norm) and the previous draft.
        Returns the drafts and each step's logits [k, vocab]; ties go to the lowest id."""
        if not tokens or k < 1:
            raise SystemExit("drafting needs a non-empty prefix and k >= 1")
        previous_hidden, _ = self.hidden_states(tokens)
        inputs = list(tokens[1:]) + [next_token]
        drafts, step_logits = [], []
        for _ in range(k):
            # Recomputing every position equals appending one to a cache: the layer is causal.
            y, _ = self._mtp_layer(previous_hidden, inputs)
            logits = self._mtp_head(y[-1:])[0]
            drafts.append(int(logits.argmax()))
            step_logits.append(logits)
            previous_hidden = torch.cat((previous_hidden, y[-1:]), dim=0)
            inputs.append(drafts[-1])
        return drafts, torch.stack(step_logits)

    def mtp_draft(self, tokens, next_token, k):
        return self.mtp_draft_steps(tokens, next_token, k)[0]

    def _attention(self, layer, x, cos, sin, previous_selection):
        config = self.config
        prefix = f"model.layers.{layer}.self_attn."
        tokens = x.shape[0]
        nope, rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        if config.q_lora_rank is None:
            q_latent = None
            q = self._linear(prefix + "q_proj", x)
        else:
            q_latent = rms_norm(
                self._linear(prefix + "q_a_proj", x), self._weight(prefix + "q_a_layernorm.weight"), LATENT_NORM_EPS
            )
            q = self._linear(prefix + "q_b_proj", q_latent)
        q = q.view(tokens, config.num_heads, nope + rope)  # per head: [nope | rope]
        q_nope = q[..., :nope]
        q_pe = apply_rope(q[..., nope:], cos, sin, config.rope_interleave)
        compressed = self._linear(prefix + "kv_a_proj_with_mqa", x)  # [latent | rope]
        latent = rms_norm(
            compressed[:, : config.kv_lora_rank], self._weight(prefix + "kv_a_layernorm.weight"), LATENT_NORM_EPS
        )
        k_pe = apply_rope(compressed[:, config.kv_lora_rank :], cos, sin, config.rope_interleave)
        kv_b = self._weight(prefix + "kv_b_proj.weight").view(config.num_heads, nope + config.v_head_dim, -1)
        selection = self._select(layer, x, q_latent, cos, sin, previous_selection)
        context = mla_attention(q_nope, q_pe, latent, k_pe, kv_b, selection[0], config.softmax_scale, self.absorbed)
        return self._linear(prefix + "o_proj", context.reshape(tokens, -1)), selection

    def _select(self, layer, x, q_latent, cos, sin, previous_selection):
        """Which keys each query attends to: all causal keys up to the dense window, the
        indexer's top index_topk beyond it. A "shared" layer reuses the latest full layer's."""
        config = self.config
        tokens = x.shape[0]
        causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        if not config.has_indexer or tokens <= self.dense_window:
            return causal, {}
        if config.indexer_type(layer) == "shared":
            return previous_selection
        first = self.dense_window  # first query position with more causal keys than the window
        scores = self._indexer_scores(layer, x, q_latent, cos, sin, first)
        allowed = causal.clone()
        dump = {}
        for position in range(first, tokens):
            chosen = top_keys(scores[position - first, : position + 1], config.index_topk)
            allowed[position] = False
            allowed[position, chosen] = True
            dump[position] = chosen.tolist()
        return allowed, dump

    def _indexer_scores(self, layer, x, q_latent, cos, sin, first):
        """Lightning-indexer scores [T - first, T] for queries first..T-1 against every key:
        score(s, t) = sum_h w_h(s) * n_heads^-0.5 * relu(q_h(s) . k(t)) * head_dim^-0.5.
        The published kernels also Hadamard-rotate q and k (orthogonal, dot products unchanged)
        and quantize them to FP8; both are precision optimisations and left out here."""
        config = self.config
        prefix = f"model.layers.{layer}.self_attn.indexer."
        heads, head_dim, rope = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
        interleave = config.indexer_rope_interleave
        # Unlike MLA, the indexer's rotary part comes first: [rope | rest].
        q = self._linear(prefix + "wq_b", q_latent[first:]).view(-1, heads, head_dim)
        q = torch.cat((apply_rope(q[..., :rope], cos[first:], sin[first:], interleave), q[..., rope:]), -1)
        k = layer_norm(
            self._linear(prefix + "wk", x),
            self._weight(prefix + "k_norm.weight"),
            self._weight(prefix + "k_norm.bias"),
            INDEXER_NORM_EPS,
        )
        k = torch.cat((apply_rope(k[:, :rope], cos, sin, interleave), k[:, rope:]), -1)
        head_weights = self._linear(prefix + "weights_proj", x[first:]) * heads**-0.5
        tokens = x.shape[0]
        out = torch.empty(q.shape[0], tokens, dtype=torch.float64)
        step = _row_block(heads, tokens)
        for start in range(0, q.shape[0], step):
            stop = min(q.shape[0], start + step)
            per_head = torch.einsum("shd,td->sht", q[start:stop], k).clamp_min(0) * head_dim**-0.5
            out[start:stop] = torch.einsum("sht,sh->st", per_head, head_weights[start:stop])
        return out

    def _mlp(self, prefix, x):
        gate = self._linear(prefix + ".gate_proj", x)
        up = self._linear(prefix + ".up_proj", x)
        return self._linear(prefix + ".down_proj", torch.nn.functional.silu(gate) * up)

    def _moe(self, prefix, x):
        config = self.config
        bias = None
        if config.topk_method == "noaux_tc":
            bias = self._weight(prefix + ".gate.e_score_correction_bias")
        experts, weights = route(x @ self._weight(prefix + ".gate.weight").T, bias, config)
        out = torch.zeros_like(x)
        # Expert by expert, so each expert's weights are read once.
        for expert in torch.unique(experts).tolist():
            rows, slots = (experts == expert).nonzero(as_tuple=True)
            expert_out = self._mlp(f"{prefix}.experts.{expert}", x[rows])
            out.index_add_(0, rows, expert_out * weights[rows, slots, None])
        if config.n_shared_experts:
            out = out + self._mlp(prefix + ".shared_experts", x)
        return out


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = Config(json.load(f))
    return config, Checkpoint(model_dir, config.weight_block_size)


def build_parser(description=__doc__):
    """The command line shared by this script and glm5_next_reference.py (which adds --kda_chunk)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--tokens", required=True, help="comma-separated token ids")
    parser.add_argument("--out", required=True, help="output: float64 little-endian logits [T][vocab]")
    parser.add_argument(
        "--dense_window",
        type=int,
        default=2051,
        help="a query with at most this many causal keys attends to all of them (default 2051)",
    )
    parser.add_argument(
        "--dump_topk",
        help="JSON file: selected key positions per layer and position (and of the MTP layer, with --mtp_out)",
    )
    parser.add_argument(
        "--mtp_out", help="output: float64 little-endian MTP logits [T-1][vocab]; row j predicts token j+2"
    )
    parser.add_argument(
        "--mtp_draft", type=int, metavar="K", help="print {\"drafts\": [...]}: K greedy MTP drafts after --tokens"
    )
    parser.add_argument("--mtp_next", type=int, metavar="S", help="with --mtp_draft: the main model's next token")
    parser.add_argument("--mtp_draft_out", help="with --mtp_draft: also write the JSON to this file")
    return parser


def _model_type(argv):
    """config.json's model_type for --model in argv, or None when it cannot be read here (the
    normal parser then reports what is wrong)."""
    model = None
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            model = argv[i + 1]
        elif arg.startswith("--model="):
            model = arg[len("--model=") :]
    try:
        with open(os.path.join(model, "config.json")) as f:
            return json.load(f).get("model_type")
    except (TypeError, OSError, ValueError, AttributeError):
        return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if _model_type(argv) == "glm5_next":
        # The KDA/MLA hybrid lives in its own module, which builds on this one and takes the
        # same options plus --kda_chunk.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import glm5_next_reference

        return glm5_next_reference.main(argv)
    args = build_parser().parse_args(argv)
    config, checkpoint = load(args.model)
    return run_cli(args, config, checkpoint, Reference(config, checkpoint, args.dense_window))


def run_cli(args, config, checkpoint, reference):
    """Runs the parsed command line on a loaded model and its Reference; writes the outputs."""
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    if not tokens or any(t < 0 or t >= config.vocab_size for t in tokens):
        raise SystemExit(f"--tokens must be ids in [0, {config.vocab_size})")
    if args.mtp_draft is not None:
        if args.mtp_draft < 1:
            raise SystemExit("--mtp_draft must be at least 1")
        if args.mtp_next is None or not 0 <= args.mtp_next < config.vocab_size:
            raise SystemExit(f"--mtp_draft needs --mtp_next, a token id in [0, {config.vocab_size})")
    elif args.mtp_next is not None or args.mtp_draft_out:
        raise SystemExit("--mtp_next and --mtp_draft_out go with --mtp_draft")
    with torch.no_grad():
        logits, selections = reference.forward(tokens)
        mtp_selection = None
        if args.mtp_out:
            mtp_logits, mtp_selection = reference.mtp_forward(tokens)
            mtp_logits.numpy().astype("<f8").tofile(args.mtp_out)
        drafts = None
        if args.mtp_draft is not None:
            drafts = reference.mtp_draft(tokens, args.mtp_next, args.mtp_draft)
    logits.numpy().astype("<f8").tofile(args.out)
    if args.dump_topk:

        def entry(layer, selected):
            kind = config.indexer_type(layer) if config.has_indexer else "none"
            return {"layer": layer, "indexer": kind, "selected": {str(p): s for p, s in selected.items()}}

        dump = {
            "dense_window": args.dense_window,
            "index_topk": config.index_topk if config.has_indexer else None,
            "layers": [entry(layer, selected) for layer, selected in enumerate(selections)],
        }
        if mtp_selection is not None:
            dump["mtp"] = entry(config.num_layers, mtp_selection)
        with open(args.dump_topk, "w") as f:
            json.dump(dump, f)
    if drafts is not None:
        text = json.dumps({"drafts": drafts})
        print(text)
        if args.mtp_draft_out:
            with open(args.mtp_draft_out, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
