"""Full-size Step-3.7-Flash vision oracle for the CUDA tower (run on the GPU machine).

Builds transformers' Step3p7ForConditionalGeneration with the release's vision tower
(Step3p7VisionConfig defaults: hidden 1536, 47 layers, 16 heads x 96, mlp int(1536 * 8960/1536)
= 8960, 728 view / 14-pixel patches -> 52x52 position table, quick_gelu, LayerNorm eps 1e-5) and
the projector 6144 -> 4096 without bias (projector_bias=False; the LM width is text hidden_size
4096), plus a one-layer throwaway LM. Every vision and projector tensor is re-randomised from a
fixed seed and bf16-rounded; `save_pretrained` writes the vendor checkpoint layout (`vision_model.*`,
`vit_large_projector.weight`, fused in_proj with un-permuted q/k; bf16) that tower-step reads.
The oracle reloads that directory with `from_pretrained` in float32 (TF32 off) and runs
`Step3p7Model.get_image_features` on one image of 6 crop tiles (504) + the global view (728): the
rows in upstream order (6 x 81 tile rows, then 169), and the same in bf16 for scale.

Writes to <case dir>: meta.json, pixels_global.f32 [1,3,S,S], pixels_local.f32 [6,3,T,T],
rows_f32.f32 [rows, text_hidden], rows_bf16.f32 (all little-endian f32).

usage: python3 step_fullsize.py <checkpoint dir> <case dir> [--tiny] [--device cpu|cuda]
  --tiny: a 64-wide 2-layer tower on 168/112 views (checks this script on a CPU machine).
"""
import argparse
import json
import os
import time

import torch
import transformers
from transformers import Step3p7Config, Step3p7ForConditionalGeneration

TILES = 6
SEED = 0


def sizes(tiny):
    """(vision config kwargs, text hidden, global side, tile side)."""
    if tiny:
        return dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=1.5,
                    image_size=168, patch_size=14), 80, 168, 112
    # the release: Step3p7VisionConfig defaults (configuration_step3p7.py:30-74)
    return dict(), 4096, 728, 504


def build_config(tiny):
    vision, text_hidden, _, _ = sizes(tiny)
    # A one-layer dense LM: only its width (the projector's output) matters here.
    text = dict(vocab_size=64, hidden_size=text_hidden, intermediate_size=96, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, mlp_layer_types=["dense"],
                pad_token_id=0, moe_intermediate_size=16, share_expert_dim=16, n_routed_experts=2,
                num_experts_per_tok=1)
    return Step3p7Config(vision_config=vision, text_config=text)


def randomize(model, g):
    """Every vision/projector tensor: linears and convs ~ N(0, 1/fan_in), LayerNorm weights ~ N(1, 0.1)
    and biases ~ N(0, 0.05), other biases ~ N(0, 0.02), LayerScale ~ N(0.1, 0.02) (the release's init
    value; it keeps 47 residual updates well conditioned), position table ~ N(0, 0.5); bf16-rounded."""
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not (name.startswith("model.vision_model.") or name.startswith("model.multi_modal_projector.")):
                continue
            if "lambda_" in name:
                p.normal_(0.1, 0.02, generator=g)
            elif "position_embedding" in name:
                p.normal_(0.0, 0.5, generator=g)
            elif p.dim() >= 2:
                p.normal_(0.0, p[0].numel() ** -0.5, generator=g)
            elif "layernorm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1, generator=g)
            elif "layernorm" in name and name.endswith("bias"):
                p.normal_(0.0, 0.05, generator=g)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=g)
            else:
                print(f"warning: no rule for {name} {tuple(p.shape)}; N(0, 0.02)")
                p.normal_(0.0, 0.02, generator=g)
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
            n += p.numel()
    return n


def rows_of(model, pv, pvl):
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=pv, pixel_values_local=pvl, num_local_patches=[TILES])
    return torch.cat(list(out.pooler_output), 0).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("case")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    os.makedirs(a.repo, exist_ok=True)
    os.makedirs(a.case, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = a.device
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print("torch", torch.__version__, "transformers", transformers.__version__, name)
    if transformers.__version__ != "5.23.0":
        # 5.17 has the step3p7 rope axes swapped (UPSTREAM_SPEC §7): not an oracle.
        raise SystemExit(f"transformers {transformers.__version__}: the oracle must be 5.23.0")
    cfg = build_config(a.tiny)
    vc = cfg.vision_config
    _, text_hidden, side, tile = sizes(a.tiny)
    print(f"vision: hidden {vc.hidden_size} x {vc.num_hidden_layers} layers, {vc.num_attention_heads} heads x "
          f"{vc.hidden_size // vc.num_attention_heads}, mlp {vc.intermediate_size}, image {vc.image_size} / "
          f"patch {vc.patch_size}; projector {4 * vc.hidden_size} -> {text_hidden}, bias {cfg.projector_bias}")

    t0 = time.time()
    g = torch.Generator(device=dev).manual_seed(SEED)
    with torch.device(dev):
        model = Step3p7ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa").float().eval()
    nrand = randomize(model, g)
    model.to(torch.bfloat16)
    model.save_pretrained(a.repo)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    t1 = time.time()
    print(f"checkpoint: {nrand / 1e6:.1f} M vision+projector values, written in {t1 - t0:.1f} s")

    m32 = Step3p7ForConditionalGeneration.from_pretrained(a.repo, dtype=torch.float32,
                                                          attn_implementation="sdpa").to(dev).eval()
    print(f"reloaded in float32 in {time.time() - t1:.1f} s")
    # Normalised-pixel range of CLIP mean/std inputs.
    pv = torch.empty(1, 3, side, side, device=dev).uniform_(-1.8, 2.1, generator=g)
    pvl = torch.empty(TILES, 3, tile, tile, device=dev).uniform_(-1.8, 2.1, generator=g)
    t2 = time.time()
    rows32 = rows_of(m32, pv, pvl)
    t3 = time.time()
    mb = m32.to(torch.bfloat16)
    rows16 = rows_of(mb, pv.to(torch.bfloat16), pvl.to(torch.bfloat16))
    rel = ((rows16 - rows32).norm() / rows32.norm()).item()
    print(f"rows {tuple(rows32.shape)} (f32 forward {t3 - t2:.2f} s); upstream bf16 vs f32 rel-L2 {rel:.3e}; "
          f"rows rms {rows32.pow(2).mean().sqrt().item():.3e}")
    if not torch.isfinite(rows32).all():
        raise SystemExit("non-finite upstream rows")
    pv.cpu().numpy().astype("<f4").tofile(os.path.join(a.case, "pixels_global.f32"))
    pvl.cpu().numpy().astype("<f4").tofile(os.path.join(a.case, "pixels_local.f32"))
    rows32.cpu().numpy().astype("<f4").tofile(os.path.join(a.case, "rows_f32.f32"))
    rows16.cpu().numpy().astype("<f4").tofile(os.path.join(a.case, "rows_bf16.f32"))
    with open(os.path.join(a.case, "meta.json"), "w") as f:
        json.dump({"side": side, "tile": tile, "tiles": TILES, "rows": list(rows32.shape),
                   "upstream_bf16_vs_f32": rel, "seed": SEED, "tiny": a.tiny,
                   "transformers": transformers.__version__, "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
