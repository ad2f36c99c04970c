#!/usr/bin/env python3
"""A vLLM-style image encoder on vision_towers.

vLLM's multimodal models implement ``embed_multimodal(**kwargs) -> list[torch.Tensor]``: one 2-D
tensor ``[placeholder tokens, hidden]`` per image, in the LM's dtype, produced on PyTorch's
current stream; the engine splices them into the prompt where ``get_placeholder_mask`` is true
(SGLang's ``get_image_feature`` is the same contract). ``VisionTowersEncoder`` gives that from
image bytes, with the prompt layout from the header alone (``plan``), so the number of
placeholder tokens always equals the rows the encoder returns.

    encoder = VisionTowersEncoder("/models/gemma-4", dtype="bfloat16")
    n = encoder.num_image_tokens(jpeg_bytes)          # before any pixel is decoded
    embeds = encoder.embed_multimodal([jpeg_bytes])   # [n, hidden] bf16 on the current stream

Run as a script (``python3 vllm_adapter.py --model DIR --image FILE…``) it encodes the images
and prints each tensor's shape, dtype and device.

PyTorch is imported when the encoder is built, never at import of this module.
"""

import argparse


class VisionTowersEncoder:
    """``embed_multimodal`` over a ``vision_towers.Model``.

    ``dtype``: the LM's dtype (``"bfloat16"``, ``"float32"`` or a torch dtype). On CUDA the rows
    are written in it directly and handed over without a copy; on the CPU (the float32 reference)
    they are converted.
    """

    def __init__(self, model_path, device="auto", dtype="bfloat16", **model_kwargs):
        import torch  # lazily: the adapter is the only part that needs PyTorch

        import vision_towers as vt

        self._torch = torch
        self.model = vt.Model(model_path, device=device, **model_kwargs)
        self.dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).removeprefix("torch."))
        self.on_cuda = self.model.device.startswith("cuda")
        if self.on_cuda and self.model.precision == "f32" and self.dtype == torch.bfloat16:
            raise ValueError("bfloat16 rows need the model in bf16: open it with precision='bf16'")

    # -- prompt layout (header only) --------------------------------------------------------

    def plan(self, image):
        """The image's plan: ``rows``, ``prompt_runs`` [(token_id, count)], ``is_embed``."""
        return self.model.plan(image)

    def num_image_tokens(self, image):
        """Embedding rows (= placeholder tokens) the image takes."""
        return self.model.plan(image)["rows"]

    def max_image_tokens(self):
        """The most rows one image can take (for profiling and encoder-cache sizing)."""
        return self.model.max_rows_per_image()

    def placeholder_mask(self, image):
        """One bool per prompt token of the image's expansion: True where a row goes."""
        return self.model.plan(image)["is_embed"]

    # -- the encoder --------------------------------------------------------------------------

    def embed_multimodal(self, images):
        """One ``[rows_i, hidden]`` tensor per image, in the LM dtype, on the current stream.

        On CUDA, ``torch.from_dlpack`` hands PyTorch's current stream to the rows, which makes
        that stream wait for the encoder on the device: no host synchronisation, and the
        tensors alias one buffer owned by vision_towers until PyTorch frees them.
        """
        torch = self._torch
        if self.on_cuda:
            rows = self.model.encode(images, dtype=self.dtype)
            return [torch.from_dlpack(r) for r in rows]
        rows = self.model.encode(images)
        return [torch.from_dlpack(r).to(self.dtype) for r in rows]

    def embed_multimodal_into(self, images, out=None):
        """Every image's rows in one ``[total rows, hidden]`` tensor (``out``, or a new one on the
        current device), written on the current stream; returns the tensor and its per-image
        views."""
        torch = self._torch
        if not self.on_cuda:
            parts = self.embed_multimodal(images)
            return torch.cat(parts), parts
        counts = [self.num_image_tokens(i) for i in images]
        if out is None:
            out = torch.empty((sum(counts), self.model.width), dtype=self.dtype, device=self.model.device)
        self.model.encode(images, out=out, out_stream=torch.cuda.current_stream())
        return out, list(torch.split(out, counts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory, .safetensors or mmproj .gguf")
    ap.add_argument("--image", required=True, nargs="+", help="image files (or data: URIs)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    enc = VisionTowersEncoder(args.model, device=args.device, dtype=args.dtype)
    print(f"{enc.model!r}; max image tokens {enc.max_image_tokens()}")
    images = [open(p, "rb").read() if not p.startswith("data:") else p for p in args.image]
    for path, img, t in zip(args.image, images, enc.embed_multimodal(images)):
        mask = enc.placeholder_mask(img)
        print(f"{path}: {tuple(t.shape)} {t.dtype} on {t.device}; {len(mask)} prompt tokens, {sum(mask)} embedded")


if __name__ == "__main__":
    main()
