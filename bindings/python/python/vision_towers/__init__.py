"""vision_towers: image bytes + a vision-language model's weight file -> the embedding rows its
prompt splices in, on the CPU (the float32 reference) or a CUDA device.

Rows come back as :class:`ImageRows`, one per image, exporting ``__dlpack__``:
``torch.from_dlpack(rows)`` is zero-copy on CUDA and ordered on the consumer's stream;
``numpy.from_dlpack(rows)`` reads host rows. No Python package is needed at import.
"""

from ._vision_towers import (
    BadImageError,
    BadInputError,
    BadModelError,
    DeviceError,
    ImageRows,
    Model,
    NoDeviceError,
    OutOfMemoryError,
    UnsupportedError,
    VisionTowersError,
    __version__,
)

__all__ = [
    "BadImageError",
    "BadInputError",
    "BadModelError",
    "DeviceError",
    "ImageRows",
    "Model",
    "NoDeviceError",
    "OutOfMemoryError",
    "UnsupportedError",
    "VisionTowersError",
    "__version__",
]
