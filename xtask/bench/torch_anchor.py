#!/usr/bin/env python3
"""The PyTorch side of `cargo xtask bench`: upstream transformers 5.23 vision towers and their
projection into the LM width, at full size with seeded random weights, bf16 on one GPU.

Cases are the anchors' table (../shared/anchors/README.md): gemma4 42x57 b1/b8; glm5_next 72x72
b1/b8 and 96x128 b1; step3p7 728 main view b1/b8 and 504 crop tiles b6, with the anchors'
configs. For every case this script
- saves the family's weights once, bf16, in the layout our loaders read (<out>/<family>/weights):
  gemma4 the HF layout (`model.vision_tower.*`, `model.embed_vision.*`, config.json), glm5_next
  `model.visual.*` + config.json, step3p7 the vendor layout (upstream's own `save_pretrained` of a
  Step3p7ForConditionalGeneration whose LM is one tiny layer);
- saves the case's exact inputs (<out>/<family>/<case>.inputs.safetensors);
- times eager SDPA and `torch.compile` (default mode, over SDPA) with CUDA events: warm-up, then
  `--iters` timed runs, median = sorted[len // 2] (the Rust side takes the same element);
- keeps the bf16 rows of the eager run and an f32 reference on the same inputs (a float copy of
  the bf16 weights with f32 rope frequencies, TF32 off; computed last, after every timing) for
  the accuracy cross-check (<case>.rows_bf16 / .rows_f32);
- counts FLOPs analytically (the anchors' formulas; the Rust side recomputes them from the
  loaded config and flags any disagreement);
and rewrites <out>/anchor.json after every step ("complete": true at the end), so a run cut short
still leaves what it measured.

torch.compile time dominates a run (the anchors' compile pass took ~7 min for 8 cases). Before
timing, one worker process per case (`--warm-procs` at a time) compiles that case once, filling
Inductor's on-disk FX-graph and Triton caches in parallel on the CPU cores; the timed process then
compiles each case again exactly as the anchors did (dynamo reset, static shapes) and finds the
cache warm. Nothing is timed while a worker runs. `--deadline` makes the compile pass skip the
cases it can no longer fit.

`VT_SDPA_BACKEND=flash` (the anchor for a forced portable GPU tier, docs/TIERS.md): SDPA may use
only its flash backend (FlashAttention-2, the kernel Ampere users get) and, where flash refuses the
mask or layout (gemma4), the memory-efficient one; cuDNN and math are off, eager and compiled
alike (the compile workers inherit the variable). `anchor.json` records the setting.

usage: python3 torch_anchor.py --out DIR [--cases NAMES|FAMILIES] [--no-compile] [--tiny]
       (--tiny: CPU-sized configs and grids, to test the plumbing on a machine without a GPU)
"""
import argparse
import copy
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import traceback

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f} s] {msg}", flush=True)


# name -> (family, geometry, batch, tiny geometry)
CASES = {
    "gemma4_b1": ("gemma4", {"gw": 42, "gh": 57}, 1, {"gw": 6, "gh": 9}),
    "gemma4_b8": ("gemma4", {"gw": 42, "gh": 57}, 8, {"gw": 6, "gh": 9}),
    "glm5_72_b1": ("glm5_next", {"gh": 72, "gw": 72}, 1, {"gh": 8, "gw": 8}),
    "glm5_96x128_b1": ("glm5_next", {"gh": 96, "gw": 128}, 1, {"gh": 8, "gw": 12}),
    "glm5_72_b8": ("glm5_next", {"gh": 72, "gw": 72}, 8, {"gh": 8, "gw": 8}),
    "step_728_b1": ("step3p7", {"side": 728}, 1, {"side": 168}),
    "step_504_b6": ("step3p7", {"side": 504}, 6, {"side": 112}),
    "step_728_b8": ("step3p7", {"side": 728}, 8, {"side": 168}),
}
FAMILIES = ("gemma4", "glm5_next", "step3p7")


def select_cases(spec):
    if not spec or spec == "all":
        return list(CASES)
    out = []
    for tok in spec.split(","):
        tok = tok.strip()
        if tok in CASES:
            names = [tok]
        elif tok in FAMILIES:
            names = [n for n, c in CASES.items() if c[0] == tok]
        else:
            sys.exit(f"unknown case or family {tok!r}; cases: {', '.join(CASES)}; families: {', '.join(FAMILIES)}")
        out += [n for n in names if n not in out]
    return [n for n in CASES if n in out]  # table order


# ---------------------------------------------------------------------------------------------
# Random weights: sensible scales so that the accuracy check means something (linears
# N(0, 1/fan_in), norms N(1, 0.1)); timing does not depend on the values.


def fill_(t, g, mean, std):
    r = torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32)
    t.copy_((r * std + mean).to(t.dtype))


def randomize(named, g, rules):
    """`rules(name, tensor) -> (mean, std) | None`; None falls back to the generic rule."""
    with torch.no_grad():
        for name, t in named:
            if not t.is_floating_point() or t.numel() == 0 or "inv_freq" in name:
                continue
            r = rules(name, t)
            if r is None:
                if t.dim() >= 2:
                    fan_in = t[0].numel()
                    r = (0.0, fan_in ** -0.5)
                elif "norm" in name or "ln" in name:
                    r = (0.0, 0.02) if name.endswith("bias") else (1.0, 0.1)
                else:
                    r = (0.0, 0.02)
            fill_(t, g, *r)


def params_and_buffers(*mods):
    for m in mods:
        yield from m.named_parameters()
        yield from m.named_buffers()


# ---------------------------------------------------------------------------------------------
# Families. Each: build(), save(dir), inputs(geom, b, g) -> dict, runner(inputs) -> fn,
# flops(geom, b), width.


class Gemma4:
    name = "gemma4"

    def __init__(self, tiny, dev):
        from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig, Gemma4VisionConfig
        from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel

        # The anchors' config (the 31B release's mmproj: standardize, no clipped linears).
        dims = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                    num_key_value_heads=16, head_dim=72, position_embedding_size=10240)
        if tiny:
            dims = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=4, head_dim=16, position_embedding_size=64)
        self.vc = Gemma4VisionConfig(**dims, patch_size=16, pooling_kernel_size=3, standardize=True,
                                     use_clipped_linears=False, hidden_activation="gelu_pytorch_tanh",
                                     rms_norm_eps=1e-6)
        self.tc = Gemma4TextConfig(hidden_size=48 if tiny else 5376)
        with torch.device(dev):
            self.tower = Gemma4VisionModel(self.vc).eval()
            self.emb = Gemma4MultimodalEmbedder(self.vc, self.tc).eval()
        self.rope = rope_buffers(self.tower)
        self.tower.to(dev, torch.bfloat16)
        self.emb.to(dev, torch.bfloat16)
        set_sdpa(self.tower)
        self.width = self.tc.hidden_size

    def randomize(self, g):
        def rules(name, t):
            if "position_embedding_table" in name:
                return (0.0, 0.3)
            if "q_norm" in name or "k_norm" in name:
                # Attention scale is 1.0 on RMS-normed q, k: weights near hd^(-1/4) keep the logits
                # at std ~1 (weights near 1 give near-argmax softmax, where bf16 rounding decides
                # which key wins and the check measures noise).
                return (self.vc.head_dim ** -0.25, 0.03)
            if name == "std_bias":
                return (0.0, 1.0)
            if name == "std_scale":
                return (1.0, 0.25)
            return None

        randomize(params_and_buffers(*self.modules()), g, rules)

    def modules(self):
        return [self.tower, self.emb]

    def save(self, d):
        from transformers.models.gemma4.configuration_gemma4 import Gemma4Config

        sd = {}
        for n, t in self.tower.state_dict().items():
            if "inv_freq" not in n:
                sd["model.vision_tower." + n] = t.to(torch.bfloat16).contiguous().cpu()
        for n, t in self.emb.state_dict().items():
            sd["model.embed_vision." + n] = t.to(torch.bfloat16).contiguous().cpu()
        os.makedirs(d, exist_ok=True)
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        cfg = Gemma4Config(vision_config=self.vc.to_dict(), text_config=self.tc.to_dict(), audio_config=None).to_dict()
        cfg["architectures"] = ["Gemma4ForConditionalGeneration"]
        dump_json(os.path.join(d, "config.json"), cfg)

    def inputs(self, geom, b, g, dev):
        gw, gh = geom["gw"], geom["gh"]
        n, pd = gw * gh, 3 * self.vc.patch_size ** 2
        pix = torch.rand(b, n, pd, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        pos = torch.stack([xs.flatten(), ys.flatten()], -1)[None].expand(b, n, 2).contiguous().to(dev)
        return {"pixel_values": pix, "pixel_position_ids": pos}

    def runner(self, inp, mods=None):
        m, e = mods or self.modules()
        pix, pos = inp["pixel_values"], inp["pixel_position_ids"]
        if pix.dtype != next(m.parameters()).dtype:
            pix = pix.to(next(m.parameters()).dtype)

        def run():
            with torch.no_grad():
                h = m(pixel_values=pix, pixel_position_ids=pos).last_hidden_state
                return e(h)

        return run

    def f32_models(self):
        return [f32_copy(self.tower, self.rope), copy.deepcopy(self.emb).float()]

    def flops(self, geom, b):
        v = self.vc
        n = geom["gw"] * geom["gh"]
        H, I, L, P, T, k = v.hidden_size, v.intermediate_size, v.num_hidden_layers, 3 * v.patch_size ** 2, \
            self.tc.hidden_size, v.pooling_kernel_size
        W = v.num_attention_heads * v.head_dim
        return b * (2 * n * P * H + L * (2 * n * (3 * W * H + W * H) + 2 * n * 3 * H * I + 4 * n * n * W)
                    + 2 * (n // (k * k)) * H * T)


class Glm5Next:
    name = "glm5_next"

    def __init__(self, tiny, dev):
        from transformers.models.glm5_next.configuration_glm5_next import Glm5NextVisionConfig
        from transformers.models.glm5_next.modeling_glm5_next import Glm5NextVisionModel

        dims = dict(depth=24, hidden_size=1024, num_heads=16, intermediate_size=4096, out_hidden_size=4096,
                    projection_intermediate_size=10240)
        if tiny:
            dims = dict(depth=2, hidden_size=64, num_heads=4, intermediate_size=96, out_hidden_size=48,
                        projection_intermediate_size=80)
        self.vc = Glm5NextVisionConfig(**dims, patch_size=14, temporal_patch_size=2, spatial_merge_size=2,
                                       rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
        with torch.device(dev):
            self.tower = Glm5NextVisionModel(self.vc).eval()
        self.rope = rope_buffers(self.tower)
        self.tower.to(dev, torch.bfloat16)
        set_sdpa(self.tower)
        self.width = self.vc.out_hidden_size

    def randomize(self, g):
        randomize(params_and_buffers(*self.modules()), g, lambda n, t: None)

    def modules(self):
        return [self.tower]

    def save(self, d):
        sd = {"model.visual." + n: t.to(torch.bfloat16).contiguous().cpu()
              for n, t in self.tower.state_dict().items() if "inv_freq" not in n}
        os.makedirs(d, exist_ok=True)
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        cfg = {"model_type": "glm5_next", "architectures": ["Glm5NextForConditionalGeneration"],
               "vision_config": self.vc.to_dict()}
        dump_json(os.path.join(d, "config.json"), cfg)

    def inputs(self, geom, b, g, dev):
        gh, gw = geom["gh"], geom["gw"]
        pd = 3 * self.vc.temporal_patch_size * self.vc.patch_size ** 2
        pix = torch.randn(b * gh * gw, pd, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        thw = torch.tensor([[1, gh, gw]] * b, device=dev, dtype=torch.int64)
        return {"hidden_states": pix, "grid_thw": thw}

    def runner(self, inp, mods=None):
        (m,) = mods or self.modules()
        pix, thw = inp["hidden_states"], inp["grid_thw"]
        if pix.dtype != next(m.parameters()).dtype:
            pix = pix.to(next(m.parameters()).dtype)

        def run():
            with torch.no_grad():
                return m(hidden_states=pix, grid_thw=thw).pooler_output

        return run

    def f32_models(self):
        return [f32_copy(self.tower, self.rope)]

    def flops(self, geom, b):
        v = self.vc
        n = geom["gh"] * geom["gw"]
        H, I, L, O, PI = v.hidden_size, v.intermediate_size, v.depth, v.out_hidden_size, \
            v.projection_intermediate_size
        pd = 3 * v.temporal_patch_size * v.patch_size ** 2
        u = v.spatial_merge_size ** 2
        t = n // u
        return b * (2 * n * pd * H + L * (2 * n * 4 * H * H + 2 * n * 3 * H * I + 4 * n * n * H)
                    + 2 * t * u * H * O + 2 * t * O * O + 2 * t * 3 * O * PI)


class Step3p7:
    name = "step3p7"

    def __init__(self, tiny, dev):
        from transformers import Step3p7Config, Step3p7ForConditionalGeneration

        vision = {}  # Step3p7VisionConfig() defaults: 1536 x 47, 16 heads, mlp 8960, 728 / 14
        text_h = 4096
        if tiny:
            vision = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=1.5,
                          image_size=168, patch_size=14)
            text_h = 48
        # The LM is one tiny layer: only its width (the projector's output) matters here.
        text = dict(vocab_size=64, hidden_size=text_h, intermediate_size=96, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, mlp_layer_types=["dense"],
                    pad_token_id=0, moe_intermediate_size=16, share_expert_dim=16, n_routed_experts=2,
                    num_experts_per_tok=1)
        cfg = Step3p7Config(vision_config=vision, text_config=text)
        with torch.device(dev):
            self.model = Step3p7ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa").eval()
        self.rope = rope_buffers(self.model.model.vision_model)
        self.model.to(dev, torch.bfloat16)
        self.tower = self.model.model.vision_model
        self.proj = self.model.model.multi_modal_projector
        set_sdpa(self.tower)
        self.vc = self.tower.config
        self.width = self.proj.out_features

    def randomize(self, g):
        def rules(name, t):
            if "lambda_" in name:  # LayerScale
                return (0.1, 0.03)
            if "position_embedding" in name:
                return (0.0, 0.3)
            if name.endswith("bias"):
                return (0.0, 0.02)
            return None

        randomize(params_and_buffers(*self.modules()), g, rules)

    def modules(self):
        return [self.tower, self.proj]

    def save(self, d):
        # upstream's own writer: save_pretrained reverts the conversion mapping (vendor names, fused
        # in_proj, un-permuted q/k rows), which is what releases ship
        self.model.save_pretrained(d)

    def inputs(self, geom, b, g, dev):
        s = geom["side"]
        pix = torch.randn(b, 3, s, s, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        return {"pixel_values": pix}

    def runner(self, inp, mods=None):
        vm, proj = mods or self.modules()
        pix = inp["pixel_values"]
        if pix.dtype != next(vm.parameters()).dtype:
            pix = pix.to(next(vm.parameters()).dtype)

        def run():
            with torch.no_grad():
                return proj(vm(pixel_values=pix).last_hidden_state)

        return run

    def f32_models(self):
        return [f32_copy(self.tower, self.rope), copy.deepcopy(self.proj).float()]

    def flops(self, geom, b):
        v = self.vc
        p = v.patch_size
        g = geom["side"] // p
        n = g * g
        H, I, L, T = v.hidden_size, v.intermediate_size, v.num_hidden_layers, self.width
        g1 = (g - 1) // 2 + 1
        g2 = (g1 - 1) // 2 + 1
        return b * (2 * n * 3 * p * p * H + L * (2 * n * 4 * H * H + 2 * n * 2 * H * I + 4 * n * n * H)
                    + 2 * g1 * g1 * 9 * H * 2 * H + 2 * g2 * g2 * 9 * 2 * H * 4 * H + 2 * g2 * g2 * 4 * H * T)


BUILDERS = {"gemma4": Gemma4, "glm5_next": Glm5Next, "step3p7": Step3p7}


def rope_buffers(m):
    """The rope frequency buffers as built (f32): `.to(bfloat16)` rounds them, as the anchors'
    bf16 models had them; the f32 reference gets these back."""
    return {n: b.detach().clone() for n, b in m.named_buffers() if "inv_freq" in n and b.is_floating_point()}


def f32_copy(m, rope):
    """A float32 copy of the bf16 module `m` (its weights exactly) with the f32 rope buffers."""
    c = copy.deepcopy(m).float()
    bufs = dict(c.named_buffers())
    with torch.no_grad():
        for n, v in rope.items():
            bufs[n].copy_(v)
    return c


def set_sdpa(m):
    if hasattr(m, "set_attn_implementation"):
        m.set_attn_implementation("sdpa")
    else:
        m.config._attn_implementation = "sdpa"


# ---------------------------------------------------------------------------------------------


def dump_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


class no_tf32:
    """TF32 off for the f32 reference only: the timed bf16 runs keep torch's defaults, as the
    anchors had them (and as the compile workers have them, or their cache entries would not match:
    restoring `allow_tf32` does not restore the `fp32_precision` the keys read)."""

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, warm, iters, dev):
    """Per-run times in ms, sorted: CUDA events around each run (host clock on the CPU)."""
    for _ in range(warm):
        fn()
    sync(dev)
    ts = []
    for _ in range(iters):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t))
    return sorted(ts)


def median(ts):
    return ts[len(ts) // 2]


# A timed window shorter than this is held open with more (untimed) runs of the same work: the
# card's energy counter, which xtask reads for the joules per image, steps only every 100 ms (H100).
ENERGY_WINDOW_S = 1.0


def hold_window(fn, w0, ms, dev):
    """Runs fn until ENERGY_WINDOW_S have passed since w0 (each run takes about ms)."""
    left = ENERGY_WINDOW_S - (time.time() - w0)
    if left > 0 and ms > 0:
        for _ in range(min(10000, math.ceil(left * 1e3 / ms))):
            fn()
        sync(dev)


def ceilings(dev):
    """torch's own bf16 GEMM 8192^3 and device-to-device copy, as the anchors measured them."""
    if dev != "cuda":
        return {}
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = median(time_ms(lambda: a @ b, 3, 10, dev))
    x = torch.empty(2 * 1024 ** 3, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms2 = median(time_ms(lambda: y.copy_(x), 3, 10, dev))
    out = {"gemm_bf16_8192_tflops": 2 * 8192 ** 3 / ms / 1e9, "copy_gbs": 2 * x.numel() / ms2 / 1e6}
    del a, b, x, y
    torch.cuda.empty_cache()
    return out


def versions(dev):
    v = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
         "cuda": torch.version.cuda, "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if dev == "cuda":
        v["device"] = torch.cuda.get_device_name()
        v["cudnn"] = torch.backends.cudnn.version()
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            v["nvidia_smi"] = q.stdout.strip()
            v["driver"] = q.stdout.split(",")[0].strip()
        except Exception as e:  # noqa: BLE001 - informational only
            v["driver"] = f"unknown ({e})"
    else:
        v["device"] = "cpu"
    return v


def compile_counters():
    try:
        from torch._dynamo.utils import counters
        c = counters["inductor"]
        return {k: int(c.get(k, 0)) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")}
    except Exception:  # noqa: BLE001 - informational only
        return {}


def compiled(run):
    import torch._dynamo
    torch._dynamo.reset()
    return torch.compile(run)


# ---------------------------------------------------------------------------------------------


def sdpa_backend():
    """Applies `VT_SDPA_BACKEND` to SDPA's global backend switches; returns the setting's name."""
    want = os.environ.get("VT_SDPA_BACKEND", "").strip()
    if not want:
        return "default"
    if want != "flash":
        raise SystemExit(f"VT_SDPA_BACKEND={want!r}: only 'flash' (FA2, memory-efficient where flash refuses)")
    import torch
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(True)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    return "flash (FA2), memory-efficient where flash refuses; cuDNN and math off"


def worker(args):
    """Compile one case once (fills the on-disk caches for the timed process) and exit."""
    sdpa_backend()
    import torch._inductor.config as inductor_config

    # Kernel-config choices benchmarked here would be timed on a GPU shared with the other
    # workers: keep none of them (the cache key ignores this setting), so the timed process
    # benchmarks its own on an idle GPU.
    inductor_config.autotune_local_cache = False
    fam, geom, b, tgeom = CASES[args.warm_case]
    geom = tgeom if args.tiny else geom
    dev = args.device
    torch.manual_seed(0)
    f = BUILDERS[fam](args.tiny, dev)
    g = torch.Generator(device=dev).manual_seed(1)
    f.randomize(g)
    run = f.runner(f.inputs(geom, b, g, dev))
    run()
    sync(dev)
    t = time.time()
    c = compiled(run)
    c()
    c()
    sync(dev)
    log(f"warm {args.warm_case}: compiled in {time.time() - t:.1f} s {compile_counters()}")


def start_workers(args, names):
    """Background compile workers, at most `args.warm_procs` at a time. Returns a poll function
    that starts queued ones and reports whether any is still running."""
    queue, running = list(names), []
    logdir = os.path.join(args.out, "logs")
    os.makedirs(logdir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 2) // max(1, args.warm_procs))))
    base = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--device", args.device]
    if args.tiny:
        base.append("--tiny")

    def poll(kill=False):
        if kill and queue:
            log(f"warm: not started (past --warm-timeout): {', '.join(queue)}")
            queue.clear()
        for p, name, fh, t in list(running):
            if kill and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the worker and its Inductor compile pool
                p.wait()
                log(f"warm {name}: stopped at --warm-timeout")
            if p.poll() is not None:
                running.remove((p, name, fh, t))
                fh.close()
                log(f"warm {name}: exit {p.returncode} after {time.time() - t:.0f} s")
        while queue and len(running) < args.warm_procs and not kill:
            name = queue.pop(0)
            fh = open(os.path.join(logdir, f"warm_{name}.log"), "w")
            p = subprocess.Popen(base + ["--warm-case", name], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                 process_group=0)
            running.append((p, name, fh, time.time()))
        return bool(running or queue)

    poll()
    return poll


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (weights, inputs, rows, anchor.json)")
    ap.add_argument("--cases", default="all", help="comma list of case names or families")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile timings")
    ap.add_argument("--tiny", action="store_true", help="tiny configs and grids (CPU plumbing test)")
    ap.add_argument("--device", default=None, help="cuda (default) or cpu (default with --tiny)")
    ap.add_argument("--iters", type=int, default=20, help="timed runs per case (median of these)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs before the eager timing")
    ap.add_argument("--compile-warmup", type=int, default=5, help="untimed runs after compiling")
    ap.add_argument("--warm-procs", type=int, default=None,
                    help="parallel compile workers that fill the caches first (0: none)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds from start after which no new compile case is started")
    ap.add_argument("--warm-timeout", type=float, default=300.0,
                    help="seconds from start after which compile workers still running are stopped")
    ap.add_argument("--warm-case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    os.makedirs(args.out, exist_ok=True)
    if args.warm_case:
        return worker(args)

    dev = args.device
    names = select_cases(args.cases)
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch (use --tiny --device cpu for a plumbing test)")
    do_compile = not args.no_compile
    if args.warm_procs is None:
        args.warm_procs = min(len(names), max(1, (os.cpu_count() or 2) // 2))
    state = {"complete": False, "tiny": args.tiny, "versions": versions(dev), "iters": args.iters,
             "sdpa_backend": sdpa_backend(),
             "warmup": args.warmup, "compile_warmup": args.compile_warmup, "compile": do_compile,
             "families": {}, "cases": {}}
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {state['versions']['device']}; "
        f"cases: {', '.join(names)}")
    out_json = os.path.join(args.out, "anchor.json")

    def save_state():
        dump_json(out_json, state)

    poll = None
    if do_compile and args.warm_procs > 0:
        poll = start_workers(args, names)
        log(f"compile workers started ({args.warm_procs} at a time)")

    # 1. models, weights, inputs (no timing while compile workers run)
    fams, inputs = {}, {}
    for i, name in enumerate(names):
        fam, geom, b, tgeom = CASES[name]
        geom = tgeom if args.tiny else geom
        if fam not in fams:
            t = time.time()
            torch.manual_seed(0)
            f = BUILDERS[fam](args.tiny, dev)
            f.randomize(torch.Generator(device=dev).manual_seed(1 + FAMILIES.index(fam)))
            wdir = os.path.join(args.out, fam, "weights")
            f.save(wdir)
            fams[fam] = f
            nparams = sum(v.numel() for n, v in params_and_buffers(*f.modules()) if "inv_freq" not in n)
            state["families"][fam] = {"weights": os.path.relpath(wdir, args.out), "values": nparams,
                                      "width": f.width}
            log(f"{fam}: built, randomized and saved ({nparams / 1e6:.1f} M values) in {time.time() - t:.1f} s")
        f = fams[fam]
        g = torch.Generator(device=dev).manual_seed(1000 + list(CASES).index(name))
        inp = f.inputs(geom, b, g, dev)
        inputs[name] = inp
        path = os.path.join(args.out, fam, f"{name}.inputs.safetensors")
        save_file({k: v.contiguous().cpu() for k, v in inp.items()}, path)
        state["cases"][name] = {"family": fam, "batch": b, "geometry": geom, "flops": f.flops(geom, b),
                                "inputs": os.path.relpath(path, args.out)}
        save_state()

    if poll is not None:
        while poll(kill=time.time() - T0 > args.warm_timeout):
            time.sleep(1)
        log("compile workers done")

    # 2. ceilings, then eager timings and the bf16 rows
    state["ceilings"] = ceilings(dev)
    if state["ceilings"]:
        c = state["ceilings"]
        log(f"torch ceilings: bf16 GEMM 8192^3 {c['gemm_bf16_8192_tflops']:.0f} TFLOP/s, copy {c['copy_gbs']:.0f} GB/s")
    save_state()
    for name in names:
        fam = CASES[name][0]
        f, case = fams[fam], state["cases"][name]
        try:
            run = f.runner(inputs[name])
            w0 = time.time()
            ts = time_ms(run, args.warmup, args.iters, dev)
            hold_window(run, w0, median(ts), dev)
            case["eager_window"] = [w0, time.time()]  # for xtask's clock samples (Unix s)
            rows = run().reshape(-1, f.width)
            case["eager_ms"], case["eager_times"] = median(ts), ts
            case["rows"] = list(rows.shape)
            p = os.path.join(args.out, fam, f"{name}.rows_bf16.safetensors")
            save_file({"rows": rows.to(torch.bfloat16).contiguous().cpu()}, p)
            case["rows_bf16"] = os.path.relpath(p, args.out)
            log(f"eager   {name:16s} {case['eager_ms']:9.2f} ms  rows {tuple(rows.shape)}  "
                f"{case['flops'] / case['eager_ms'] / 1e9:7.1f} TFLOP/s")
            del rows
        except Exception as e:  # noqa: BLE001 - recorded, the other cases go on
            case["eager_error"] = repr(e)
            log(f"eager   {name} FAILED: {e!r}")
            traceback.print_exc(limit=4)
        save_state()

    # 3. torch.compile (default mode over SDPA), one static compile per case as the anchors did
    if do_compile:
        for name in names:
            fam = CASES[name][0]
            f, case = fams[fam], state["cases"][name]
            if args.deadline is not None and time.time() - T0 > args.deadline:
                case["compile_error"] = "skipped: past the deadline"
                log(f"compile {name}: skipped (past the {args.deadline:.0f} s deadline)")
                save_state()
                continue
            try:
                before = compile_counters()
                t = time.time()
                c = compiled(f.runner(inputs[name]))
                c()
                sync(dev)
                case["compile_s"] = time.time() - t
                after = compile_counters()
                case["compile_cache"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                w0 = time.time()
                ts = time_ms(c, args.compile_warmup, args.iters, dev)
                hold_window(c, w0, median(ts), dev)
                case["compile_window"] = [w0, time.time()]
                case["compile_ms"], case["compile_times"] = median(ts), ts
                log(f"compile {name:16s} {case['compile_ms']:9.2f} ms  "
                    f"{case['flops'] / case['compile_ms'] / 1e9:7.1f} TFLOP/s  (compiled in {case['compile_s']:.1f} s, "
                    f"cache {case['compile_cache']})")
                del c
            except Exception as e:  # noqa: BLE001 - recorded, the other cases go on
                case["compile_error"] = repr(e)
                log(f"compile {name} FAILED: {e!r}")
                traceback.print_exc(limit=4)
            save_state()

    # 4. the f32 reference (last: switching TF32 off changes the global state that Inductor's
    # cache keys include, and the compile workers ran with torch's defaults)
    with no_tf32():
        for fam, f in fams.items():
            m32 = None
            for name in (n for n in names if CASES[n][0] == fam):
                case = state["cases"][name]
                try:
                    m32 = m32 or f.f32_models()
                    r32 = f.runner(inputs[name], m32)().reshape(-1, f.width).float()
                    p = os.path.join(args.out, fam, f"{name}.rows_f32.safetensors")
                    save_file({"rows": r32.contiguous().cpu()}, p)
                    case["rows_f32"] = os.path.relpath(p, args.out)
                    del r32
                except Exception as e:  # noqa: BLE001 - recorded, the other cases go on
                    case["f32_error"] = repr(e)
                    log(f"f32 reference {name} FAILED: {e!r}")
                    traceback.print_exc(limit=4)
                save_state()
            del m32
            if dev == "cuda":
                torch.cuda.empty_cache()
    log("f32 references saved")

    state["complete"] = True
    state["wall_s"] = time.time() - T0
    save_state()
    log(f"done: {out_json}")


if __name__ == "__main__":
    import torch
    import transformers
    from safetensors.torch import save_file

    main()
