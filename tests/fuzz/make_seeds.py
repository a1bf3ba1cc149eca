#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Every seed is a small real input of its target, spelled out here so that it
can be read and regenerated: OpenAI bodies, HTTP connections, conversations
and tokenizer_config.json texts, tokenizer inputs, tiny llama2.c and
safetensors models, and RoundPlan streams (text protos encoded by protoc).
Run from anywhere: python3 tests/fuzz/make_seeds.py. It replaces the files it
writes and leaves others (seeds added by hand) alone.
"""
import json
import os
import struct
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= 100 * 1024, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


# ---- openai_request_fuzz: request bodies -----------------------------------
OPENAI = {
    "completion": {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 16},
    "completion_list": {"model": "m", "prompt": ["a", "b"], "n": 2, "logprobs": 3, "echo": False,
                        "stop": ["\n", "."], "seed": 7, "temperature": 0.7, "top_p": 0.9},
    "completion_ids": {"model": "m", "prompt": [[1, 2, 3], [4]], "stop_token_ids": [2],
                       "max_tokens": 1.0, "top_k": -1, "min_p": 0.1},
    "chat": {"model": "stories260K", "messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}],
             "stream": True, "stream_options": {"include_usage": True}},
    "chat_parts": {"model": "m", "messages": [{"role": "user",
                                               "content": [{"type": "text", "text": "x"}]}],
                   "logprobs": True, "top_logprobs": 5, "max_completion_tokens": 4,
                   "presence_penalty": 0.5, "frequency_penalty": -0.5, "user": "u",
                   "prompt_cache_key": "k", "request_id": "r-1", "ignore_eos": True,
                   "loop_watchdog": False},
    "tokenize": {"model": "m", "prompt": "hello", "add_special_tokens": False},
    "detokenize": {"model": "m", "tokens": [1, 400, 2]},
    "unsupported": {"model": "m", "prompt": "x", "tools": [], "logit_bias": {"1": 2}},
}
for name, body in OPENAI.items():
    put("openai_request_fuzz", name + ".json", json.dumps(body))
put("openai_request_fuzz", "big_number.json", '{"model":"m","prompt":"x","max_tokens":1e300,"seed":-1}')
put("openai_request_fuzz", "nested.json", '{"model":"m","prompt":"x","logprobs":' + "[" * 64 + "]" * 64 + "}")
put("openai_request_fuzz", "escapes.json", '{"model":"m\\u0000","prompt":"\\ud83d\\ude00\\n"}')

# ---- http_server_fuzz: byte 0 = how to send, byte 1 = split point -----------
def http(name, raw, how=0, split=0):
    put("http_server_fuzz", name, bytes([how, split]) + raw)

http("get", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
http("post_json", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
     b"Content-Length: 13\r\n\r\n{\"model\":\"m\"}")
http("chunked_stream", b"POST /stream?x=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\n", how=1, split=100)
http("keepalive_two", b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /none HTTP/1.1\r\nHost: x\r\n\r\n")
http("throw", b"GET /throw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
http("cut", b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n")
http("too_big", b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 99999\r\n\r\nxx")
http("expect", b"POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc")
http("http10", b"GET / HTTP/1.0\r\n\r\n")
http("garbage", b"\x00\x01 GET\r\n\r\n")
http("idle", b"GET /a HTTP/1.1\r\nHost: x\r\n", how=0x0f)

# ---- chat_template_fuzz: byte 0 = mode, byte 1 = family/generation prompt ---
def conv(messages, family, gen=True):
    body = b"".join(r.encode() + b"\0" + c.encode() + b"\0" for r, c in messages)
    return bytes([0, family * 2 + (1 if gen else 0)]) + body

CONV = [("system", "You are helpful."), ("user", " Hello \n"), ("assistant", "Hi!"),
        ("user", "Tell me a story.")]
for fam in range(6):
    put("chat_template_fuzz", f"render_{fam}", conv(CONV, fam, fam % 2 == 0))
put("chat_template_fuzz", "render_bad_role", conv([("tool", "x"), ("observation", "y")], 5))
for name, tmpl in {
    "chatml": "{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}<|im_end|>\n{% endfor %}",
    "qwen2": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "llama3": "<|start_header_id|>{{ role }}<|end_header_id|>",
    "llama31": "<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date: December 2023",
    "glm4": "[gMASK]<sop>{% for m in messages %}<|{{m.role}}|>{% endfor %}",
    "glm45": "[gMASK]<sop><think></think>",
    "none": "{{ messages }}",
}.items():
    put("chat_template_fuzz", "detect_" + name, b"\x01\x00" + json.dumps({"chat_template": tmpl}).encode())
put("chat_template_fuzz", "detect_list", b"\x01\x00" + json.dumps(
    {"chat_template": [{"name": "tool_use", "template": "x"},
                       {"name": "default", "template": "<|im_start|>"}]}).encode())

# ---- tokenizer_fuzz: byte 0 = tokenizer (0 tok512.bin, 1 tok512.model,
# 2 byte_level, 3 gpt2, 4 qwen2, 5 sp_bpe, 6 metaspace), byte 1 = flags --------
TEXTS = ["Once upon a time, there was a little girl.", " leading and  double  spaces ",
         "caf\u00e9 \u4e2d\u6587 \U0001F600 e\u0301", "<s> </s> <|begin_of_text|> <|eot_id|>",
         "line\nbreak\ttab 12345"]
for tok in range(7):
    for i, text in enumerate(TEXTS):
        put("tokenizer_fuzz", f"encode_{tok}_{i}", bytes([tok, 2 * (i % 2)]) + text.encode())
    ids = [1, 3, 4, 100, 259, 300, 2, 0, 511, 40]
    put("tokenizer_fuzz", f"decode_{tok}", bytes([tok, 1]) + b"".join(struct.pack("<H", i + 1) for i in ids))
put("tokenizer_fuzz", "encode_invalid_utf8", b"\x02\x00ab\xff\xc3(\xe2\x82")

# ---- tokenizer_load_fuzz: byte 0 = format ----------------------------------
put("tokenizer_load_fuzz", "llama2c_tok512", b"\x00" + read("deploy/models/stories260K/tok512.bin"))
put("tokenizer_load_fuzz", "sentencepiece_tok512", b"\x01" + read("deploy/models/stories260K/tok512.model"))
for fixture in ["byte_level", "gpt2", "qwen2", "metaspace"]:
    put("tokenizer_load_fuzz", "json_" + fixture,
        b"\x02" + read(f"router/tokenizer/testdata/{fixture}/tokenizer.json"))
put("tokenizer_load_fuzz", "json_sp_bpe_with_config",
    b"\x03" + read("router/tokenizer/testdata/sp_bpe/tokenizer.json") + b"\0" +
    read("router/tokenizer/testdata/sp_bpe/tokenizer_config.json"))

# ---- llama2c_loader_fuzz: tiny checkpoints in run.c's legacy format ---------
def llama2c(dim, hidden, layers, heads, kv_heads, vocab, seq_len, tied=True):
    head = dim // heads
    kv_dim = dim * kv_heads // heads
    floats = (vocab * dim + layers * dim + layers * dim * dim + 2 * layers * kv_dim * dim +
              layers * dim * dim + layers * dim + 3 * layers * hidden * dim + dim +
              2 * seq_len * (head // 2) + (0 if tied else vocab * dim))
    header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if tied else -vocab, seq_len)
    # Small deterministic weights (norms near 1 keep activations finite).
    body = b"".join(struct.pack("<f", ((i * 2654435761) % 1000) / 1000.0 - 0.5) for i in range(floats))
    return header + body

put("llama2c_loader_fuzz", "tied_gqa", llama2c(8, 16, 1, 2, 1, 16, 8))
put("llama2c_loader_fuzz", "untied_mha", llama2c(8, 12, 2, 2, 2, 12, 4, tied=False))
put("llama2c_loader_fuzz", "one_head", llama2c(4, 4, 1, 1, 1, 8, 2))
put("llama2c_loader_fuzz", "header_only", struct.pack("<7i", 8, 16, 1, 2, 1, 16, 8))

# ---- safetensors_fuzz: byte 0 = mode ----------------------------------------
def safetensors(tensors, dtype="F32", metadata=None):
    """tensors: [(name, shape)], filled with small deterministic values."""
    size = {"F32": 4, "BF16": 2}[dtype]
    header, blobs, offset = {}, [], 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        vals = [((i * 40503 + len(name)) % 200) / 200.0 - 0.5 for i in range(n)]
        if dtype == "F32":
            blob = b"".join(struct.pack("<f", v) for v in vals)
        else:
            blob = b"".join(struct.pack("<f", v)[2:] for v in vals)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def tiny_model(tied=True, hidden=8, inter=16, heads=2, kv_heads=1, vocab=16):
    hd = hidden // heads
    t = [("model.embed_tokens.weight", [vocab, hidden]), ("model.norm.weight", [hidden]),
         ("model.layers.0.input_layernorm.weight", [hidden]),
         ("model.layers.0.post_attention_layernorm.weight", [hidden]),
         ("model.layers.0.self_attn.q_proj.weight", [heads * hd, hidden]),
         ("model.layers.0.self_attn.k_proj.weight", [kv_heads * hd, hidden]),
         ("model.layers.0.self_attn.v_proj.weight", [kv_heads * hd, hidden]),
         ("model.layers.0.self_attn.o_proj.weight", [hidden, heads * hd]),
         ("model.layers.0.mlp.gate_proj.weight", [inter, hidden]),
         ("model.layers.0.mlp.up_proj.weight", [inter, hidden]),
         ("model.layers.0.mlp.down_proj.weight", [hidden, inter])]
    if not tied:
        t.append(("lm_head.weight", [vocab, hidden]))
    return t

put("safetensors_fuzz", "tiny_f32", b"\x00" + safetensors(tiny_model(), metadata={"format": "pt"}))
put("safetensors_fuzz", "tiny_bf16", b"\x00" + safetensors(tiny_model(), dtype="BF16"))
config = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 10,
          "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
          "hidden_act": "silu", "tie_word_embeddings": False}
put("safetensors_fuzz", "config_untied", b"\x01" + json.dumps(config).encode() + b"\0" +
    safetensors(tiny_model(tied=False, inter=12, kv_heads=2, vocab=10)))
put("safetensors_fuzz", "empty_header", b"\x00" + struct.pack("<Q", 8) + b"{}      ")


def tiny_glm5():
    """glm_moe_dsa: a dense then a MoE layer, latent attention, an indexer with
    GLM-5.2 sharing (layer 1 shared, so no indexer tensors), YaRN."""
    h, heads, ql, kl, nope, rope, v, ih, idim, e, einter = 8, 2, 4, 4, 2, 2, 2, 2, 4, 4, 2
    config = {"model_type": "glm_moe_dsa", "hidden_size": h, "intermediate_size": 12,
              "num_hidden_layers": 2, "num_attention_heads": heads, "vocab_size": 16,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "q_lora_rank": ql,
              "kv_lora_rank": kl, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
              "v_head_dim": v, "n_routed_experts": e, "n_shared_experts": 1,
              "num_experts_per_tok": 2, "moe_intermediate_size": einter, "n_group": 2,
              "topk_group": 1, "mlp_layer_types": ["dense", "sparse"], "index_topk": 2,
              "index_n_heads": ih, "index_head_dim": idim, "indexer_types": ["full", "shared"],
              "rope_theta": 10000.0,
              "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                               "original_max_position_embeddings": 16},
              "tie_word_embeddings": True}
    t = [("model.embed_tokens.weight", [16, h]), ("model.norm.weight", [h])]
    for l in range(2):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
              (p + "self_attn.q_a_proj.weight", [ql, h]), (p + "self_attn.q_a_layernorm.weight", [ql]),
              (p + "self_attn.q_b_proj.weight", [heads * (nope + rope), ql]),
              (p + "self_attn.kv_a_proj_with_mqa.weight", [kl + rope, h]),
              (p + "self_attn.kv_a_layernorm.weight", [kl]),
              (p + "self_attn.kv_b_proj.weight", [heads * (nope + v), kl]),
              (p + "self_attn.o_proj.weight", [h, heads * v])]
        if l == 0:
            t += [(p + "self_attn.indexer.wq_b.weight", [ih * idim, ql]),
                  (p + "self_attn.indexer.wk.weight", [idim, h]),
                  (p + "self_attn.indexer.k_norm.weight", [idim]),
                  (p + "self_attn.indexer.k_norm.bias", [idim]),
                  (p + "self_attn.indexer.weights_proj.weight", [ih, h]),
                  (p + "mlp.gate_proj.weight", [12, h]), (p + "mlp.up_proj.weight", [12, h]),
                  (p + "mlp.down_proj.weight", [h, 12])]
        else:
            t += [(p + "mlp.gate.weight", [e, h]), (p + "mlp.gate.e_score_correction_bias", [e])]
            for x in range(e):
                q = f"{p}mlp.experts.{x}."
                t += [(q + "gate_proj.weight", [einter, h]), (q + "up_proj.weight", [einter, h]),
                      (q + "down_proj.weight", [h, einter])]
            t += [(p + "mlp.shared_experts.gate_proj.weight", [einter, h]),
                  (p + "mlp.shared_experts.up_proj.weight", [einter, h]),
                  (p + "mlp.shared_experts.down_proj.weight", [h, einter])]
    return config, t


glm_config, glm_tensors = tiny_glm5()
put("safetensors_fuzz", "config_glm_moe_dsa", b"\x01" + json.dumps(glm_config).encode() + b"\0" +
    safetensors(glm_tensors, dtype="BF16"))

# ---- round_plan_fuzz: streams of RoundPlans (stories260K: vocab 512, 16 KV
# blocks of 4 positions) -------------------------------------------------------
GREEDY = "sampling { temperature: 0 seed: 1 }"
STREAMS = {
    "prefill_decode_verify_release": [
        f"round_id: 1 rows {{ lane_id: 7 token_ids: [1, 403, 407, 261] block_ids: [0] sample_last: true {GREEDY} }}",
        "round_id: 2 rows { lane_id: 7 start_position: 4 use_last_sampled: true block_ids: [0, 1] sample_last: true }",
        "round_id: 3 rows { lane_id: 7 start_position: 5 use_last_sampled: true token_ids: [300, 301] "
        "block_ids: [0, 1] verify_offsets: [0, 1, 2] }",
        "round_id: 4 rows { lane_id: 7 release_lane: true }",
    ],
    "two_lanes_sampled": [
        "round_id: 1 rows { lane_id: 1 token_ids: [1, 20, 30] block_ids: [2] sample_last: true "
        "sampling { temperature: 0.8 top_k: 5 top_p: 0.9 min_p: 0.05 presence_penalty: 0.5 "
        "frequency_penalty: -0.5 seed: 42 top_logprobs: 3 logprobs: true } choice_index: 1 } "
        "rows { lane_id: 2 token_ids: [1, 20] block_ids: [3] sample_last: true "
        "sampling { temperature: 1.5 seed: 9 } }",
        "round_id: 2 rows { lane_id: 1 start_position: 3 use_last_sampled: true block_ids: [2] "
        "sample_last: true } rows { lane_id: 2 start_position: 2 use_last_sampled: true "
        "token_ids: [5] block_ids: [3] sample_last: true release_lane: true }",
    ],
    "chunked_prefill": [
        f"round_id: 1 rows {{ lane_id: 3 token_ids: [1, 2, 3, 4, 5, 6] block_ids: [4, 5] {GREEDY} }}",
        "round_id: 2 rows { lane_id: 3 start_position: 6 token_ids: [7, 8, 9] block_ids: [4, 5, 6] "
        "sample_last: true }",
    ],
    "rejected": [
        "round_id: 1 rows { lane_id: 9 token_ids: [1] block_ids: [0] sample_last: true }",
        f"round_id: 2 rows {{ lane_id: 9 token_ids: [1, 600] block_ids: [99] sample_last: true {GREEDY} }}",
        f"round_id: 3 rows {{ lane_id: 9 token_ids: [1] block_ids: [0] {GREEDY} }} "
        f"rows {{ lane_id: 9 token_ids: [2] block_ids: [1] }}",
    ],
}


def encode_plan(text):
    out = subprocess.run(
        ["protoc", "--encode=ringlane.v1.RoundPlan", "-I", os.path.join(ROOT, "proto"),
         "ringlane/v1/worker.proto"], input=text.encode(), capture_output=True, check=True)
    return out.stdout


def varint(n):
    b = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            b += bytes([byte | 0x80])
        else:
            return b + bytes([byte])


for name, plans in STREAMS.items():
    # Field 1, length-delimited, once per plan: `repeated RoundPlan plans = 1`.
    put("round_plan_fuzz", name, b"".join(b"\x0a" + varint(len(p)) + p for p in map(encode_plan, plans)))
