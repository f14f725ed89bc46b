#!/usr/bin/env python3
"""Reference outputs from Hugging Face transformers for moeserve's parity tests.

Builds small random checkpoints of Qwen3 / Qwen3-MoE configurations with transformers, moves every weight
(norm weights and the router included) off its init value, saves them with save_pretrained, and writes greedy
tokens and top-5 logprobs for a few prompts, computed in fp32 on the CPU (no TF32, no kernels that reorder
sums differently per run). moeserve's CPU test suite loads the same checkpoints and must match.

Run on the GPU machine (transformers 5.x is there):
    python3 tools/reference/make_parity_fixtures.py --out /tmp/parity
Writes OUT/<case>/ (a Hugging Face checkpoint) and OUT/reference.json.
"""
import argparse
import copy
import json
import math
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file

NEW_TOKENS = 8
TOP_K = 5


def dense(name, **kw):
    base = dict(model_type="qwen3", vocab_size=384, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1e6)
    base.update(kw)
    return name, base


def moe(name, **kw):
    base = dict(model_type="qwen3_moe", vocab_size=384, hidden_size=64, intermediate_size=96,
                moe_intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[], max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_theta=1e6)
    base.update(kw)
    return name, base


CASES = [
    dense("qwen3_basic", tie_word_embeddings=True),
    dense("qwen3_odd_heads", hidden_size=80, num_attention_heads=6, num_key_value_heads=3, head_dim=24,
          num_hidden_layers=3, rope_theta=1e4, rms_norm_eps=1e-5),
    dense("qwen3_mha_bias", hidden_size=48, num_attention_heads=5, num_key_value_heads=5, head_dim=16,
          attention_bias=True, vocab_size=301),
    dense("qwen3_gqa6_yarn", hidden_size=96, num_attention_heads=6, num_key_value_heads=1, head_dim=32,
          rope_theta=1e4, max_position_embeddings=256,
          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    moe("moe_basic"),
    moe("moe_top1", num_experts=4, num_experts_per_tok=1, norm_topk_prob=False, tie_word_embeddings=True),
    moe("moe_top3_nonorm", hidden_size=72, num_attention_heads=6, num_key_value_heads=2, head_dim=20,
        num_experts=7, num_experts_per_tok=3, norm_topk_prob=False, rope_theta=1e4),
    moe("moe_top4_mlp_only", num_hidden_layers=3, num_experts=6, num_experts_per_tok=4, mlp_only_layers=[1],
        num_attention_heads=3, num_key_value_heads=1, head_dim=24),
    moe("moe_sparse_step2", num_hidden_layers=4, decoder_sparse_step=2, tie_word_embeddings=True, rope_theta=1e4,
        num_experts=5, num_experts_per_tok=2),
    moe("moe_yarn", num_experts_per_tok=3, max_position_embeddings=256,
        rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
                      "beta_fast": 16, "beta_slow": 2}),
]


def make_config(kw):
    kw = dict(kw)
    model_type = kw.pop("model_type")
    rope_scaling = kw.pop("rope_scaling", None)
    rope_theta = kw.pop("rope_theta")
    cls = transformers.Qwen3Config if model_type == "qwen3" else transformers.Qwen3MoeConfig
    rope = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling:
        rope = dict(rope_scaling)
        rope["rope_theta"] = rope_theta
    try:
        cfg = cls(rope_parameters=rope, **kw)
    except TypeError:  # transformers 4.x spelling
        cfg = cls(rope_theta=rope_theta, rope_scaling=rope_scaling, **kw)
    cfg.torch_dtype = torch.float32
    return cfg


def perturb(model, seed, lm_head_scale=4.0, router_scale=3.0):
    """Every weight off its init value, scaled so activations stay O(1) and logits are peaked.

    The BF16 fixtures use lm_head_scale 1 (logits of a trained model's size: BF16's relative error moves a
    logprob in proportion to the logits) and router_scale 6 (decisive routing: an expert choice that BF16
    rounding could flip changes a layer's output wholesale, which no tolerance describes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                scale = 1.0 / math.sqrt(fan_in)
                if "embed_tokens" in name:
                    # Tied to lm_head in some cases: then it sets the logits' size as lm_head would.
                    tied = model.config.tie_word_embeddings
                    scale = lm_head_scale / math.sqrt(fan_in) if tied and lm_head_scale < 4.0 else 1.0
                elif "lm_head" in name:
                    scale = lm_head_scale / math.sqrt(fan_in)
                elif name.endswith("mlp.gate.weight"):
                    scale = router_scale / math.sqrt(fan_in)  # decisive routing: no near-ties among experts
                p.copy_(scale * torch.randn(p.shape, generator=g))


def prompts(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 7, 23, 90)]


@torch.no_grad()
def greedy_reference(model, ids):
    ids = list(ids)
    steps = []
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([ids])).logits[0, -1].double()
        logp = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logits, TOP_K)
        tok = int(top.indices[0])
        steps.append({
            "token": tok,
            "top2_gap": float(top.values[0] - top.values[1]),
            "top_ids": [int(i) for i in top.indices],
            "top_logprobs": [float(logp[i]) for i in top.indices],
        })
        ids.append(tok)
    return steps


def convert_expert_layout(src_dir, dst_dir, cfg):
    """Re-save a MoE checkpoint with the other expert layout (fused 3-D <-> one tensor per expert)."""
    os.makedirs(dst_dir, exist_ok=True)
    state = {}
    for f in sorted(os.listdir(src_dir)):
        if f.endswith(".safetensors"):
            state.update(load_file(os.path.join(src_dir, f)))
    out = {}
    inter = cfg.moe_intermediate_size
    for k, v in state.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = v[e, inter:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
        elif ".mlp.experts." in k and k.endswith("gate_proj.weight"):
            pre = k.split(".mlp.experts.")[0] + ".mlp.experts."
            if pre + "gate_up_proj" in out:
                continue
            n = cfg.num_experts
            out[pre + "gate_up_proj"] = torch.stack([
                torch.cat([state[f"{pre}{e}.gate_proj.weight"], state[f"{pre}{e}.up_proj.weight"]], 0)
                for e in range(n)]).contiguous()
            out[pre + "down_proj"] = torch.stack([state[f"{pre}{e}.down_proj.weight"] for e in range(n)]).contiguous()
        elif ".mlp.experts." in k:
            continue
        else:
            out[k] = v.contiguous()
    save_file(out, os.path.join(dst_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src_dir, "config.json"), dst_dir)
    return sorted(out.keys())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="checkpoint dtype; bfloat16 rounds the weights first and computes the reference in fp32 "
                         "on those exact values, so a BF16 engine is measured by its arithmetic alone")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    reference = {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": args.dtype,
                 "new_tokens": NEW_TOKENS, "cases": []}
    for i, (name, kw) in enumerate(CASES):
        cfg = make_config(kw)
        cls = transformers.Qwen3ForCausalLM if kw["model_type"] == "qwen3" else transformers.Qwen3MoeForCausalLM
        model = cls(cfg).float().eval()
        model.config.use_cache = False
        if args.dtype == "bfloat16":
            perturb(model, 1000 + i, lm_head_scale=1.0, router_scale=6.0)
        else:
            perturb(model, 1000 + i)
        if args.dtype == "bfloat16":
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        if cfg.tie_word_embeddings:
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        d = os.path.join(args.out, name)
        # Sharded on purpose for some cases so the index path is exercised.
        shard = "60KB" if i % 3 == 1 else "50MB"
        if args.dtype == "bfloat16":
            # A converted copy: converting the model itself would also round its fp32 buffers (RoPE inv_freq),
            # which the reference must keep as transformers computes them.
            copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d, max_shard_size=shard)
        else:
            model.save_pretrained(d, max_shard_size=shard)
        keys = []
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                keys += list(load_file(os.path.join(d, f)).keys())
        case = {"name": name, "dirs": [name], "keys": sorted(keys), "prompts": []}
        if kw["model_type"] == "qwen3_moe" and name == "moe_basic" and args.dtype == "float32":
            alt = name + "_other_layout"
            case["alt_keys"] = convert_expert_layout(d, os.path.join(args.out, alt), cfg)
            case["dirs"].append(alt)
        for p in prompts(cfg.vocab_size, 77 + i):
            case["prompts"].append({"input_ids": p, "steps": greedy_reference(model, p)})
        reference["cases"].append(case)
        gaps = [s["top2_gap"] for pr in case["prompts"] for s in pr["steps"]]
        print(f"{name}: {len(keys)} tensors, min top2 gap {min(gaps):.4f}, files {sorted(os.listdir(d))}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)


if __name__ == "__main__":
    main()
