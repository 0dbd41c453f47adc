"""decode's data set: photo-like JPEGs generated once (pink noise, a spread of qualities) and cached,
at the two sizes the bench reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

#: Bump when the generator changes, so a cached data set is not reused across versions.
GENERATOR_VERSION = 1
SIZES = ((500, 375), (2400, 1800))  # (width, height)
MIN_SIZE = (224, 224)  # (h, w) for the DCT-scaled variants


def size_name(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def pink_noise(rng, height: int, width: int, alpha: float):
    """Zero-mean, unit-std noise whose amplitude spectrum falls as 1/f**alpha (alpha=1 is the
    1/f^2 power spectrum of natural images), shaped in the Fourier domain."""
    import numpy as np

    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    freq = np.sqrt(fx * fx + fy * fy)
    freq[0, 0] = 1.0
    amplitude = freq ** np.float32(-alpha)
    amplitude[0, 0] = 0.0
    phase = rng.standard_normal(amplitude.shape, dtype=np.float32) + 1j * rng.standard_normal(
        amplitude.shape, dtype=np.float32
    )
    field = np.fft.irfft2(amplitude * phase, s=(height, width)).astype(np.float32)
    field -= field.mean()
    field /= field.std() + 1e-12
    return field


def photo_like(seed: int, width: int, height: int):
    """An RGB uint8 image that compresses like a photo: a 1/f-textured background with mostly
    luminance and a little chroma texture, 6-13 textured objects with anti-aliased edges,
    muted colours, a smooth illumination gradient with vignetting, slight optical blur and
    mild sensor noise."""
    import cv2
    import numpy as np

    texture, blur, noise = 28.0, 0.4, 1.0  # tuned for ~1.5-3.8 bits/pixel at q75-95, 500x375
    rng = np.random.default_rng([GENERATOR_VERSION, width, height, seed])
    gray = rng.uniform(70, 180)
    base = (gray + rng.uniform(-1, 1, 3) * 35).astype(np.float32)
    luma = pink_noise(rng, height, width, 1.0) * texture
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        img[:, :, c] = base[c] + luma + pink_noise(rng, height, width, 1.4) * texture * 0.35
    for _ in range(rng.integers(6, 14)):
        mask = np.zeros((height, width), np.uint8)
        cx, cy = int(rng.uniform(0, width)), int(rng.uniform(0, height))
        if rng.random() < 0.5:
            axes = (int(rng.uniform(0.05, 0.3) * width), int(rng.uniform(0.05, 0.3) * height))
            cv2.ellipse(mask, (cx, cy), axes, float(rng.uniform(0, 180)), 0, 360, 255, -1, cv2.LINE_AA)
        else:
            points = np.stack([rng.uniform(0, width, 5), rng.uniform(0, height, 5)], -1).astype(np.int32)
            cv2.fillPoly(mask, [cv2.convexHull(points)], 255, cv2.LINE_AA)
        alpha = (mask.astype(np.float32) / 255)[:, :, None]
        gray = rng.uniform(40, 210)
        color = (gray + rng.uniform(-1, 1, 3) * rng.uniform(10, 60)).astype(np.float32)
        surface = pink_noise(rng, height, width, 1.0 + rng.uniform(-0.2, 0.5)) * texture * rng.uniform(0.3, 1.3)
        img = img * (1 - alpha) + (color + surface[:, :, None]) * alpha
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    yy, xx = yy / height - 0.5, xx / width - 0.5
    gx, gy = rng.uniform(-0.5, 0.5, 2)
    img *= ((1 + gx * xx + gy * yy) * (1 - 0.35 * (xx * xx + yy * yy)))[:, :, None]
    img = cv2.GaussianBlur(img, (0, 0), blur)
    img += rng.standard_normal(img.shape, dtype=np.float32) * noise
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def qualities(count: int) -> list[int]:
    if count == 1:
        return [85]
    return [round(75 + 20 * i / (count - 1)) for i in range(count)]


def dataset(
    root: Path, counts: dict[tuple[int, int], int], *, generate: bool = True, log: Callable[[str], None] = print
) -> dict[tuple[int, int], list[Path]]:
    """{size: [paths]}, generating (once) what ``root`` does not hold yet."""
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[tuple[int, int], list[Path]] = {}
    for size, count in counts.items():
        if count <= 0:
            continue
        width, height = size
        paths[size] = []
        for index, quality in enumerate(qualities(count)):
            path = root / f"{size_name(size)}_{index:03d}_q{quality}.jpg"
            if not path.exists():
                if not generate:
                    raise FileNotFoundError(path)
                from PIL import Image

                log(f"generating {path}")
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                Image.fromarray(photo_like(index, width, height)).save(tmp, "JPEG", quality=quality, subsampling=2)
                os.replace(tmp, path)
            paths[size].append(path)
    return paths


def bits_per_pixel(paths: list[Path], size: tuple[int, int]) -> list[float]:
    return [p.stat().st_size * 8 / (size[0] * size[1]) for p in paths]
