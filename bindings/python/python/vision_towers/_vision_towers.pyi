"""Type stubs of the extension module (hand-written; `tests/test_stubs.py` checks them against
the module)."""

import os
import pathlib
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

__version__: str

VideoFrames = Union[Sequence["ImageArg"], bytes, bytearray, memoryview, Any]
"""A video's frames, every frame in order: a list of encoded images (only the sampled frames are
read), raw RGB frames back to back in a bytes-like object (with ``width`` and ``height``), or a
uint8 array ``[frames, height, width, 3]`` exporting ``__dlpack__``."""

ImageArg = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
"""An image: its file's bytes, a path to the file, or a ``data:`` URI string (other URI schemes
are refused; a plain string is a path)."""

class VisionTowersError(Exception):
    """Base of every error vision_towers raises; the message is the command line's."""

    kind: str
    """The error class, e.g. ``prep:OverBudget``, ``safetensors:InvalidJson``, ``out_of_memory``."""
    index: Optional[int]
    """The image the error is about, by its position in the call (None when not one image)."""

class BadImageError(VisionTowersError):
    """An image was refused (not an image, over the decode budget, corrupt, unreadable, a refused
    URI scheme, over the pass ceiling), or a video: over its metadata budgets (kind
    ``prep:VideoOverBudget``), frames that do not fit its metadata (``prep:BadVideo``), a frame
    refused as an image would be (``prep:VideoFrame``, ``index`` the frame)."""

class BadModelError(VisionTowersError):
    """The weight file, its configs or its tokenizer files were refused."""

class BadInputError(VisionTowersError):
    """Processor tensors given to ``encode_prepared`` were refused."""

class NoDeviceError(VisionTowersError):
    """The CUDA device asked for does not open."""

class OutOfMemoryError(VisionTowersError):
    """The device ran out of memory; the model stays usable."""

class UnsupportedError(VisionTowersError):
    """A device, precision, dtype or output this model cannot give, or video for a family
    without a video path (kind ``prep:NoVideoPath``)."""

class DeviceError(VisionTowersError):
    """Any other CUDA failure."""

class ImageRows:
    """One image's rows ``[rows, width]`` (or one video's, from ``Model.encode_video``), row-major: host float32 for a CPU model, device memory
    (float32, bfloat16 or float16) for a CUDA model. Exports DLPack without a copy."""

    @property
    def shape(self) -> Tuple[int, int]: ...
    @property
    def dtype(self) -> str:
        """``"float32"``, ``"bfloat16"`` or ``"float16"``."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def data_ptr(self) -> int:
        """Address of the first row (a device address for CUDA rows)."""
    @property
    def nbytes(self) -> int: ...
    @property
    def plan(self) -> Optional[dict[str, Any]]:
        """The image's plan (as ``Model.plan``), the video's (as ``Model.plan_video``) for the
        rows of ``encode_video``, None for rows of processor tensors."""
    def to_bytes(self) -> bytes:
        """The rows' bytes, little-endian in their dtype (a copy; waits for device rows)."""
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __dlpack__(
        self,
        stream: Optional[int] = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule. ``stream``: None or 1 = legacy default stream, 2 = per-thread
        default stream, -1 = no synchronisation, else a ``CUstream``; that stream waits for the
        rows on the device before this returns. ``max_version >= (1, 0)``: a versioned capsule."""
    def __len__(self) -> int: ...

class Model:
    """A model's image processor and vision tower behind one thread-safe handle."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        device: str = "auto",
        precision: Optional[str] = None,
        max_soft_tokens: Optional[int] = None,
        max_image_tokens: Optional[int] = None,
        max_megapixels: Optional[float] = None,
        graphs: bool = True,
        max_patches_per_pass: Optional[int] = None,
        gpu_tier: Optional[str] = None,
    ) -> None:
        """Opens a GGUF mmproj, a ``.safetensors`` file, a model directory or a sharded
        directory. ``device``: ``"auto"`` (CUDA 0 where it opens, else the CPU), ``"cpu"``,
        ``"cuda"`` or ``"cuda:N"``. ``precision``: ``"f32"``, ``"bf16"`` or ``"f16"`` (default: f32
        on the CPU, bf16 on CUDA where the GPU tier has bf16 tensor cores, f16 on Turing; bf16 and
        f16 run on CUDA only).
        ``gpu_tier``: run an older GPU tier on this card (``"8.0"``, ``"7.5"``, …), a test of
        code paths (``GPU_CORE_FORCE_TIER`` does the same). Where ``"auto"`` finds a CUDA
        device it cannot use, the model runs on the CPU and a RuntimeWarning says why."""
    @property
    def family(self) -> str:
        """``"gemma4"``, ``"glm5_next"``, ``"glm_ocr"`` or ``"step3p7"``."""
    @property
    def width(self) -> int:
        """The LM width of the rows."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def precision(self) -> str:
        """``"f32"``, ``"bf16"`` or ``"f16"``."""
    @property
    def cpu_reason(self) -> Optional[str]:
        """Why ``"auto"`` runs on the CPU although a CUDA device is present; None otherwise."""
    @property
    def gpu_tier(self) -> Optional[str]:
        """The GPU tier the tower runs (``"9.0 Hopper (H100, H200, GH200)"``); None on the CPU."""
    @property
    def lm_attention(self) -> str:
        """``"causal"``, ``"bidirectional"`` or ``"bidirectional_image_runs_in_sliding_layers"``."""
    @property
    def path(self) -> pathlib.Path:
        """The weight file or directory it was opened from."""
    def plan(self, image: ImageArg) -> dict[str, Any]:
        """The plan from the image's header alone: ``rows``, ``prompt_runs`` ((id, count)
        tuples), ``prompt_tokens``, ``is_embed`` (one bool per prompt token), ``target`` (w, h),
        ``grid``, ``width``, ``height``, ``family``, ``processor``, ``detail``."""
    def max_rows_per_image(self) -> int:
        """The most rows one image can give under this model's settings."""
    def encode(
        self,
        images: Sequence[ImageArg],
        dtype: Optional[Any] = None,
        *,
        out: Optional[Any] = None,
        out_stream: Optional[Any] = None,
    ) -> list[Any]:
        """One ``ImageRows`` per image (with ``out``: each image's row count). ``dtype``:
        ``"float32"``/``"bfloat16"``/``"float16"`` or a torch dtype (CUDA; default the model's
        precision; a 16-bit dtype only from a model of that precision).
        ``out``: a contiguous CUDA tensor ``[total rows, width]``; ``out_stream``: the stream to
        order with (a ``CUstream`` int or a stream object; default the legacy default stream)."""
    def encode_prepared(
        self,
        tensors: Mapping[str, Any],
        dtype: Optional[Any] = None,
        *,
        out: Optional[Any] = None,
        out_stream: Optional[Any] = None,
    ) -> list[Any]:
        """``encode`` from the HF image processor's tensors (CPU arrays by upstream name)."""
    def plan_video(
        self,
        frames: VideoFrames,
        *,
        fps: Optional[float] = None,
        total_num_frames: Optional[int] = None,
        duration: Optional[float] = None,
        width: Optional[int] = None,
        height: Optional[int] = None,
        sample_fps: Optional[float] = None,
        num_frames: Optional[int] = None,
        max_frames: Optional[int] = None,
        max_soft_tokens: Optional[int] = None,
        min_image_tokens: Optional[int] = None,
        max_image_tokens: Optional[int] = None,
    ) -> dict[str, Any]:
        """A video's plan from its metadata and frame size (nothing decoded): ``rows``,
        ``frames_indices``, ``timestamps``, ``video_grid_thw``, ``target``, ``content``,
        ``width``, ``height``, ``family``, ``processor``, ``prompt`` (pieces in order: a token run
        ``(id, count, embeds)``, text a ``str``), ``prompt_tokens``, ``prompt_runs`` ((id, count)
        of the runs) and ``is_embed`` (one bool per token of the runs)."""
    def encode_video(
        self,
        frames: VideoFrames,
        *,
        fps: Optional[float] = None,
        total_num_frames: Optional[int] = None,
        duration: Optional[float] = None,
        width: Optional[int] = None,
        height: Optional[int] = None,
        sample_fps: Optional[float] = None,
        num_frames: Optional[int] = None,
        max_frames: Optional[int] = None,
        max_soft_tokens: Optional[int] = None,
        min_image_tokens: Optional[int] = None,
        max_image_tokens: Optional[int] = None,
        dtype: Optional[Any] = None,
    ) -> ImageRows:
        """One video's rows as one ``ImageRows`` (``.plan`` is ``plan_video``'s). ``fps``: the
        video's frame rate; ``sample_fps``: glm5_next's target sampling rate; ``num_frames``:
        gemma4's frames sampled. Metadata budgets are checked before any frame is read
        (``BadImageError``, kind ``prep:VideoOverBudget``); a family without video raises
        ``UnsupportedError`` (kind ``prep:NoVideoPath``); a setting out of range ValueError."""
