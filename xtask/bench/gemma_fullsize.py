"""Full-size Gemma-4 vision oracle for the CUDA tower (run on the GPU machine).

Builds transformers' Gemma4VisionModel + Gemma4MultimodalEmbedder at the 31B release size
(hidden 1152, 27 layers, 16 heads x 72, ffn 4304, output 5376, pooling 3, position table 10240,
standardize=True as the 31B mmproj carries v.std_bias/v.std_scale, no clipped linears) with random
weights (every tensor re-randomised, bf16-rounded), saves them as an HF checkpoint directory
(`model.vision_tower.*`, `model.embed_vision.*`, config.json), runs upstream in float32 (and bf16,
for scale) on one random 42x57-patch image and writes the case for `gemma-check`:
meta.json, pixels.f32, rows_f32.f32, rows_bf16.f32.

usage: python3 gemma_fullsize.py <checkpoint dir> <case dir>
"""
import json
import os
import sys
import time

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.gemma4.configuration_gemma4 import (
    Gemma4Config,
    Gemma4TextConfig,
    Gemma4VisionConfig,
)
from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel

GW, GH = 42, 57  # the anchors' image: 2394 patches, 266 soft tokens
TEXT_HIDDEN = 5376


def bf16_round_(t):
    t.copy_(t.to(torch.bfloat16).to(t.dtype))


def randomize(model, emb, g):
    """Sensible random weights: linears ~ N(0, 1/fan_in), norms ~ N(1, 0.1) (q/k norms ~ N(0.34, 0.03)),
    tables ~ N(0, 0.3)."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + [("emb." + n, p) for n, p in emb.named_parameters()]:
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=g)
            elif "position_embedding_table" in name:
                p.normal_(0.0, 0.3, generator=g)
            elif "q_norm" in name or "k_norm" in name:
                # Attention scale is 1.0 on RMS-normed q, k: logits ~ N(0, hd·(w_q·w_k)²). Weights
                # near 1 give logit std ~8.5 at hd 72 (near-argmax softmax, so a bf16 rounding flips
                # which key wins and 27 layers decorrelate: seen, rel-L2 ~1 even for upstream bf16).
                # 0.34 ≈ hd^(-1/4) gives logit std ~1, a well-conditioned tower.
                p.normal_(0.34, 0.03, generator=g)
            elif "norm" in name:
                p.normal_(1.0, 0.1, generator=g)
            else:
                print(f"warning: no rule for parameter {name} {tuple(p.shape)}; N(0, 0.02)")
                p.normal_(0.0, 0.02, generator=g)
            bf16_round_(p)
        for name, b in model.named_buffers():
            if name == "std_bias":
                b.normal_(0.0, 1.0, generator=g)
            elif name == "std_scale":
                b.uniform_(0.5, 1.5, generator=g)
            else:
                continue
            bf16_round_(b)


def main():
    repo, case = sys.argv[1], sys.argv[2]
    os.makedirs(repo, exist_ok=True)
    os.makedirs(case, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())
    vc = Gemma4VisionConfig(
        hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
        num_key_value_heads=16, head_dim=72, patch_size=16, pooling_kernel_size=3,
        position_embedding_size=10240, standardize=True, use_clipped_linears=False,
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
    )
    tc = Gemma4TextConfig(hidden_size=TEXT_HIDDEN)
    t0 = time.time()
    with torch.device(dev):
        model = Gemma4VisionModel(vc).float().eval()
        emb = Gemma4MultimodalEmbedder(vc, tc).float().eval()
    g = torch.Generator(device=dev).manual_seed(0)
    randomize(model, emb, g)
    # The real checkpoint's names (Gemma4Model: vision_tower, embed_vision), bf16 on disk.
    sd = {}
    for n, t in model.state_dict().items():
        if "inv_freq" in n:
            continue
        sd["model.vision_tower." + n] = t.to(torch.bfloat16).contiguous().cpu()
    for n, t in emb.state_dict().items():
        sd["model.embed_vision." + n] = t.to(torch.bfloat16).contiguous().cpu()
    save_file(sd, os.path.join(repo, "model.safetensors"), metadata={"format": "pt"})
    try:
        cfg = Gemma4Config(vision_config=vc.to_dict(), text_config=tc.to_dict(), audio_config=None).to_dict()
    except Exception as e:  # keep going with the fields the loader reads
        print("Gemma4Config failed:", e)
        cfg = {"model_type": "gemma4", "vision_config": vc.to_dict(), "text_config": tc.to_dict()}
    cfg["architectures"] = ["Gemma4ForConditionalGeneration"]
    with open(os.path.join(repo, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, default=str)
    nparams = sum(t.numel() for t in sd.values())
    print(f"checkpoint: {len(sd)} tensors, {nparams / 1e6:.1f} M values, written in {time.time() - t0:.1f} s")

    n = GW * GH
    pix = torch.rand(1, n, 768, generator=g, device=dev, dtype=torch.float32)
    ys, xs = torch.meshgrid(torch.arange(GH), torch.arange(GW), indexing="ij")
    pos = torch.stack([xs.flatten(), ys.flatten()], -1)[None].to(dev)
    with torch.no_grad():
        model.set_attn_implementation("sdpa") if hasattr(model, "set_attn_implementation") else None
        h = model(pixel_values=pix, pixel_position_ids=pos).last_hidden_state
        rows32 = emb(h.float()).float()
        mb, eb = model.to(torch.bfloat16), emb.to(torch.bfloat16)
        hb = mb(pixel_values=pix.to(torch.bfloat16), pixel_position_ids=pos).last_hidden_state
        rows16 = eb(hb).float()
    print("rows", tuple(rows32.shape), "upstream bf16 vs f32 rel-L2",
          ((rows16 - rows32).norm() / rows32.norm()).item())
    pix.cpu().numpy().tofile(os.path.join(case, "pixels.f32"))
    rows32.cpu().numpy().tofile(os.path.join(case, "rows_f32.f32"))
    rows16.cpu().numpy().tofile(os.path.join(case, "rows_bf16.f32"))
    with open(os.path.join(case, "meta.json"), "w") as f:
        json.dump({"gw": GW, "gh": GH, "rows": list(rows32.shape)}, f)


if __name__ == "__main__":
    main()
