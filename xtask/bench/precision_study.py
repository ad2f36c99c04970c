#!/usr/bin/env python3
"""Precision study on the bench's own weights and inputs: does an FP8 mode earn its place (issue 21),
and where does a bf16 forward's distance from f32 come from (issue 22: llama.cpp's F16 files keep 3 more
mantissa bits than our bf16)? Three measurements, before any kernel is written:

1. Fidelity. Every `nn.Linear` of the tower and its projector computes as an e4m3 GEMM would:
   the input quantized per token (row absmax / 448), the weight per output channel, both rounded
   to float8_e4m3fn, products accumulated in f32 and scaled back. Two variants per case:
     fp8+f32   the f32 reference model with FP8 linears (the FP8 rounding alone);
     fp8+bf16  upstream's bf16 model with FP8 linears (what an FP8 mode over today's bf16 kernels
               would be, attention and norms in bf16);
   each as rel-L2 against the bench's f32 rows (<case>.rows_f32), beside upstream's own bf16 rows
   (<case>.rows_bf16). The gate (issue 21): FP8 ships for a family only where its rows are no further
   from f32 than upstream's bf16 forward, on every case.
2. Speed ceiling. For every GEMM shape as the forward ran it (rows × in × out, recorded), the
   same run times torch's bf16 GEMM and its FP8 row-wise scaled GEMM (`torch._scaled_mm`, e4m3,
   per-row and per-column f32 scales, bf16 out: cuBLASLt / CUTLASS on Hopper); with our own time of
   the case from `ours.json` (same anchor directory), the case's time with FP8 GEMMs is estimated as
   ours − Σ bf16 GEMM + Σ FP8 GEMM (+ one activation-quantization pass per GEMM input at the copy
   bandwidth, when it is not fused into the kernel before it). The goal: ≥ 1.4× our bf16 at b8.

3. Ablation (b1 cases, `--ablate`): the f32 model with one part rounded as a kernel would round it —
     gemm-bf16   every linear's input and output rounded to bf16 (the weights are bf16 already);
     attn-bf16   q, k, v and the softmax probabilities rounded to bf16 (as our attention kernel
                 feeds its tensor cores), the rest of the attention in f32;
     attn-f16    the same in f16 (llama.cpp's FlashAttention: K and V cast to F16);
     gemm-bf16+attn-f16, gemm-bf16+attn-bf16 (≈ our bf16 forward);
   each as rel-L2 against the f32 rows: which rounding dominates, and what f16 attention would buy.

Nothing here is timed against ours directly: our GEMMs are cuBLASLt's, so torch's bf16 GEMM on the
same shape is the stand-in (the bench showed ours within 2 % of cuBLASLt's best algorithm).

usage: python3 precision_study.py --anchor /tmp/vt-bench [--cases all] [--out precision.json] [--tiny] [--ablate]
(--anchor: a directory `cargo xtask bench` / torch_anchor.py filled, with rows_f32 and ours.json;
 --tiny: CPU plumbing test against `torch_anchor.py --tiny` output, fidelity only)
"""
import argparse
import json
import os
import sys
import time

T0 = time.time()
E4M3_MAX = 448.0  # largest finite float8_e4m3fn (OCP FP8 spec): the per-row scale maps absmax to it


def log(msg):
    print(f"[{time.time() - T0:7.1f} s] {msg}", flush=True)


def fake_quant(x, dim):
    """(q, scale) with q the e4m3-rounded values of x / scale as f32 and scale the absmax over `dim` / 448."""
    x = x.float()
    s = x.abs().amax(dim=dim, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    q = (x / s).to(torch.float8_e4m3fn).float()
    return q, s


# (rows, in, out) -> calls, filled while a forward runs with recording on: the GEMM shapes exactly
# as the tower ran them (merger and projector rows included)
RECORD = None


def make_bf16io_forward(lin):
    """Replaces `lin.forward` (an f32 module) with inputs and outputs rounded to bf16, f32 arithmetic."""
    w = lin.weight.detach().to(torch.bfloat16).float()
    bias = None if lin.bias is None else lin.bias.detach().float()

    def forward(x):
        y = torch.nn.functional.linear(x.to(torch.bfloat16).float(), w, bias)
        return y.to(torch.bfloat16).to(x.dtype)

    lin.forward = forward


def make_fp8_forward(lin):
    """Replaces `lin.forward` with the e4m3 GEMM's arithmetic (weights quantized once)."""
    qw, sw = fake_quant(lin.weight.detach(), dim=1)  # [n, k], per output channel
    qw_t = qw.t().contiguous()
    sw_row = sw.reshape(1, -1)
    bias = None if lin.bias is None else lin.bias.detach().float()
    out_dtype = lin.weight.dtype

    def forward(x):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        if RECORD is not None:
            key = (x2.shape[0], qw.shape[1], qw.shape[0])
            RECORD[key] = RECORD.get(key, 0) + 1
        qx, sx = fake_quant(x2, dim=1)  # per token
        y = (qx @ qw_t) * sx * sw_row  # f32 accumulation, scales applied to the f32 accumulator
        if bias is not None:
            y = y + bias
        return y.to(out_dtype).reshape(*shp[:-1], -1)

    lin.forward = forward


def replace_linears(mods, make=make_fp8_forward):
    n = 0
    for m in mods:
        for _, sub in m.named_modules():
            if isinstance(sub, torch.nn.Linear):
                make(sub)
                n += 1
    return n


# SDPA with q, k, v and the probabilities rounded to ATTN_ROUND (None: torch's own SDPA, untouched)
ATTN_ROUND = None
_SDPA = None


def rounded_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, scale=None, is_causal=False, **kw):
    if ATTN_ROUND is None:
        return _SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, is_causal=is_causal, **kw)
    dt, odt = ATTN_ROUND, q.dtype
    if k.shape[1] != q.shape[1]:  # grouped keys: repeat them per query head
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    q, k, v = (t.to(dt).float() for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), device=q.device, dtype=torch.float32)
    for h in range(q.shape[1]):  # one head at a time: the score matrix of 12288 tokens is 600 MB
        sc = q[:, h] @ k[:, h].transpose(-1, -2) * scale
        if attn_mask is not None:
            m = attn_mask[:, h if attn_mask.shape[1] > 1 else 0]
            sc = sc.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else sc + m.float()
        if is_causal:
            sc = sc.masked_fill(torch.ones_like(sc, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(sc, dim=-1).to(dt).float()
        out[:, h] = p @ v[:, h]
    return out.to(odt)


def rel_l2(a, b):
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    return float((a - b).norm() / b.norm())


def gemm_times(shapes, dev, iters=20):
    """Per (m, k, n): (bf16 ms, fp8 ms), m rounded up to 16 for `_scaled_mm`."""
    out = {}
    for (m, k, n) in shapes:
        mp = (m + 15) // 16 * 16
        x = torch.randn(mp, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
        ta_ms = ta.median(ta.time_ms(lambda: torch.nn.functional.linear(x, w), 3, iters, dev))
        xq = x.to(torch.float8_e4m3fn)
        wq = w.to(torch.float8_e4m3fn)
        sx = torch.ones(mp, 1, device=dev, dtype=torch.float32)
        sw = torch.ones(1, n, device=dev, dtype=torch.float32)
        try:
            f8_ms = ta.median(ta.time_ms(
                lambda: torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16),
                3, iters, dev))
        except Exception as e:  # noqa: BLE001 - recorded
            log(f"_scaled_mm {mp}x{k}x{n} failed: {e!r}")
            f8_ms = None
        out[(m, k, n)] = (ta_ms, f8_ms)
        del x, w, xq, wq
    return out


def ours_ms(anchor, case):
    try:
        with open(os.path.join(anchor, "ours.json")) as fh:
            o = json.load(fh)
    except OSError:
        return None

    def walk(d):
        if isinstance(d, dict):
            if case in d and isinstance(d[case], dict) and "ms" in d[case]:
                return d[case]["ms"]
            for v in d.values():
                r = walk(v)
                if r is not None:
                    return r
        return None

    return walk(o)


ABLATIONS = {  # name -> (linears rounded to bf16, attention rounding dtype or None)
    "gemm-bf16": (True, None),
    "attn-bf16": (False, "bfloat16"),
    "attn-f16": (False, "float16"),
    "gemm-bf16+attn-bf16": (True, "bfloat16"),
    "gemm-bf16+attn-f16": (True, "float16"),
}


def load_case(anchor, fam, name, dev):
    d = os.path.join(anchor, fam)
    inp = {k: v.to(dev) for k, v in load_file(os.path.join(d, f"{name}.inputs.safetensors")).items()}
    ref = load_file(os.path.join(d, f"{name}.rows_f32.safetensors"))["rows"].to(dev)
    bf = load_file(os.path.join(d, f"{name}.rows_bf16.safetensors"))["rows"].to(dev)
    return inp, ref, bf


def ablate(f, fam, names, anchor, dev, res):
    """The ABLATIONS on the family's b1 cases (fresh f32 copies of the untouched bf16 model)."""
    global ATTN_ROUND
    for name in names:
        if ta.CASES[name][2] != 1:
            continue
        try:
            inp, ref, _ = load_case(anchor, fam, name, dev)
        except Exception as e:  # noqa: BLE001 - recorded
            log(f"{name}: anchor files missing ({e!r})")
            continue
        out = res.setdefault("ablation", {}).setdefault(name, {})
        for ab, (gemm, attn) in ABLATIONS.items():
            m = f.f32_models()
            if gemm:
                replace_linears(m, make_bf16io_forward)
            ATTN_ROUND = getattr(torch, attn) if attn else None
            try:
                with torch.no_grad():
                    y = f.runner(inp, m)().reshape(-1, f.width)
                out[ab] = rel_l2(y, ref)
                del y
            except Exception as e:  # noqa: BLE001 - recorded
                out[ab] = repr(e)
            finally:
                ATTN_ROUND = None
                del m
                if dev == "cuda":
                    torch.cuda.empty_cache()
        log(f"{name:16s} ablation rel-L2 vs f32: " + ", ".join(
            f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v[:60]}" for k, v in out.items()))


def main():
    global RECORD, _SDPA
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", required=True, help="directory torch_anchor.py / xtask bench filled")
    ap.add_argument("--cases", default="all", help="comma list of case names or families")
    ap.add_argument("--out", default=None, help="JSON results (default <anchor>/precision.json)")
    ap.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (plumbing test)")
    ap.add_argument("--no-speed", action="store_true", help="fidelity only")
    ap.add_argument("--ablate", action="store_true", help="also the rounding ablations on the b1 cases")
    args = ap.parse_args()
    dev = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    names = ta.select_cases(args.cases)
    out_path = args.out or os.path.join(args.anchor, "precision.json")
    _SDPA = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = rounded_sdpa
    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "cases": {}}
    copy_gbs = None
    if dev == "cuda" and not args.no_speed:
        c = ta.ceilings(dev)
        copy_gbs = c.get("copy_gbs")
        res["ceilings"] = c
        log(f"ceilings: bf16 GEMM {c['gemm_bf16_8192_tflops']:.0f} TFLOP/s, copy {copy_gbs:.0f} GB/s")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for fam in ta.FAMILIES:
        fam_cases = [n for n in names if ta.CASES[n][0] == fam]
        if not fam_cases:
            continue
        t = time.time()
        torch.manual_seed(0)
        f = ta.BUILDERS[fam](args.tiny, dev)  # the bench's seeds: the same weights it saved
        f.randomize(torch.Generator(device=dev).manual_seed(1 + ta.FAMILIES.index(fam)))
        if args.ablate:
            ablate(f, fam, fam_cases, args.anchor, dev, res)
        m32 = f.f32_models()
        nlin = replace_linears(m32)
        replace_linears(f.modules())  # the bf16 model, in place (the bench's bf16 rows are on disk)
        log(f"{fam}: built in {time.time() - t:.1f} s; {nlin} linears")
        for name in fam_cases:
            _, geom, b, tgeom = ta.CASES[name]
            geom = tgeom if args.tiny else geom
            r = {}
            try:
                inp, ref, bf = load_case(args.anchor, fam, name, dev)
            except Exception as e:  # noqa: BLE001 - recorded
                log(f"{name}: anchor files missing ({e!r})")
                res["cases"][name] = {"error": repr(e)}
                continue
            r["upstream_bf16"] = rel_l2(bf, ref)
            y32 = f.runner(inp, m32)().reshape(-1, f.width)
            r["fp8_f32"] = rel_l2(y32, ref)
            RECORD = {}
            y16 = f.runner(inp)().reshape(-1, f.width)
            shapes, RECORD = RECORD, None
            r["fp8_bf16"] = rel_l2(y16, ref)
            r["nan"] = bool(torch.isnan(y32).any() or torch.isnan(y16).any())
            del y32, y16
            log(f"{name:16s} rel-L2 vs f32: upstream bf16 {r['upstream_bf16']:.2e}, fp8+f32 {r['fp8_f32']:.2e}, "
                f"fp8+bf16 {r['fp8_bf16']:.2e}{'  NaN!' if r['nan'] else ''}")
            if dev == "cuda" and not args.no_speed:
                gt = gemm_times(shapes, dev)
                bf_ms = sum(c * gt[s][0] for s, c in shapes.items())
                f8_ok = all(gt[s][1] is not None for s in shapes)
                f8_ms = sum(c * gt[s][1] for s, c in shapes.items()) if f8_ok else None
                # one read of bf16 + one write of e4m3 per GEMM input element, at the copy bandwidth
                q_ms = sum(c * s[0] * s[1] * 3 for s, c in shapes.items()) / (copy_gbs * 1e6) if copy_gbs else None
                o = ours_ms(args.anchor, name)
                r.update({"gemm_bf16_ms": bf_ms, "gemm_fp8_ms": f8_ms, "quant_pass_ms": q_ms,
                          "ours_ms": o, "per_shape": {f"{m}x{k}x{n}": {"count": c, "bf16_ms": gt[(m, k, n)][0],
                                                                        "fp8_ms": gt[(m, k, n)][1]}
                                                      for (m, k, n), c in shapes.items()}})
                if f8_ms is not None:
                    line = f"{name:16s} {len(shapes)} GEMM shapes: bf16 {bf_ms:.2f} ms, fp8 {f8_ms:.2f} ms ({bf_ms / f8_ms:.2f}×)"
                    if o:
                        fused = o - bf_ms + f8_ms
                        r["est_fp8_fused_ms"], r["est_fp8_unfused_ms"] = fused, fused + q_ms
                        line += (f"; ours {o:.2f} ms → fp8 est. {fused:.2f} ms ({o / fused:.2f}×) with fused "
                                 f"quantization, {fused + q_ms:.2f} ms ({o / (fused + q_ms):.2f}×) with one "
                                 f"extra pass per GEMM input")
                    log(line)
            res["cases"][name] = r
            with open(out_path, "w") as fh:
                json.dump(res, fh, indent=1)
        del f, m32
        if dev == "cuda":
            torch.cuda.empty_cache()
    log("=== table ===")
    print("| case | upstream bf16 | fp8 + f32 | fp8 + bf16 | gate | bf16 GEMMs ms | fp8 GEMMs ms | ours ms | "
          "fp8 est. ms (fused / unfused quant) | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in res["cases"].items():
        if "error" in r:
            print(f"| {name} | {r['error'][:60]} |")
            continue
        gate = "holds" if r["fp8_bf16"] <= r["upstream_bf16"] and not r["nan"] else "fails"
        sp = ""
        if r.get("est_fp8_fused_ms"):
            sp = (f"{r['est_fp8_fused_ms']:.2f} / {r['est_fp8_unfused_ms']:.2f} | "
                  f"{r['ours_ms'] / r['est_fp8_fused_ms']:.2f}× / {r['ours_ms'] / r['est_fp8_unfused_ms']:.2f}×")
        gm = (f"{r['gemm_bf16_ms']:.2f} | {r['gemm_fp8_ms']:.2f} | {r['ours_ms'] or '—'}"
              if r.get("gemm_fp8_ms") is not None else "— | — | —")
        print(f"| {name} | {r['upstream_bf16']:.2e} | {r['fp8_f32']:.2e} | {r['fp8_bf16']:.2e} | {gate} | {gm} | {sp} |")
    if res.get("ablation"):
        print()
        print("| case | " + " | ".join(ABLATIONS) + " |")
        print("|---|" + "---|" * len(ABLATIONS))
        for name, out in res["ablation"].items():
            print(f"| {name} | " + " | ".join(f"{out[a]:.2e}" if isinstance(out.get(a), float) else "—"
                                              for a in ABLATIONS) + " |")
    with open(out_path, "w") as fh:
        json.dump(res, fh, indent=1)
    log(f"done: {out_path}")


if __name__ == "__main__":
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_anchor as ta

    ta.torch, ta.transformers, ta.save_file = torch, transformers, save_file
    main()
