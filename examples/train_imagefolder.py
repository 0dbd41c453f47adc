"""Train a ResNet-18 from scratch on an ImageFolder dataset: a plain torchvision training script.

Nothing in here knows about nanopatch. Run it as it is, then run the very same file under
nanopatch and compare the images/s:

    python examples/train_imagefolder.py                      # stock PyTorch
    python -m nanopatch examples/train_imagefolder.py         # the same script, patched
    python -m nanopatch --compare examples/train_imagefolder.py   # both, side by side

Without ``--data`` the script first makes a small synthetic, photo-like dataset (five kinds
of scene, a few hundred JPEGs, built with numpy and Pillow only) in a cache folder and reuses
it on later runs. With ``--data DIR`` it trains on your own ImageFolder root, which must hold
``train/`` and ``val/`` with one subfolder per class.

It prints one line per epoch and one summary line at the end:

    epoch 1/2: train loss 1.2345, train accuracy 40.00%, val loss 1.1000, val accuracy 45.00% (36/80), 33.1 images/s
    final: train loss 1.2345, val accuracy 45.00% (36/80), 33.1 images/s, 52.3 s

images/s counts training images over the time spent in the training loops (data loading
included; making the dataset and validating excluded); the last figure is the wall time of
the whole run, from parsing the arguments to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a ResNet-18 on an ImageFolder dataset.")
    parser.add_argument("--data", type=Path, help="ImageFolder root with train/ and val/ (default: a demo set)")
    # 60 steps of 16: with fewer, larger steps validation accuracy after so short a run from scratch swings
    # by 20 points with the smallest change (a seed, a rounding), and says little.
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    # A small learning rate: with only a few dozen steps from scratch, a larger one moves the weights faster than
    # BatchNorm's running statistics can follow, and the model does badly in eval mode. It decays to zero over the
    # run (cosine): with a constant rate the last steps still move the weights as much as the first, and the
    # validation accuracy at the end swings by 20 points between seeds, or between two runs that differ only in
    # rounding, where the decayed rate settles it within a few.
    parser.add_argument("--lr", type=float, default=0.002, help="the learning rate at the start (cosine decay to 0)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir(), help="where the demo set is kept")
    parser.add_argument("--num-images", type=int, default=400, help="size of the demo set (80%% train, 20%% val)")
    args = parser.parse_args()
    for name in ("epochs", "batch_size", "image_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.data is None and args.num_images < 2 * len(SCENES):
        parser.error(f"--num-images must be at least {2 * len(SCENES)} (one train and one val image per class)")
    return args


def default_cache_dir() -> Path:
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home) / "nanopatch" / "demo-imagefolder-v1"


# --------------------------------------------------------------------------------------------
# The demo dataset: procedurally generated photo-like scenes.
#
# Each image is drawn in float RGB (0..1) from 1/f noise textures (the spectrum natural images
# have), smooth gradients and anti-aliased shapes, then given uneven lighting, a colour cast,
# a slight blur (it is drawn at half size and scaled up) and sensor noise, and saved as a
# JPEG. Every image has its own random generator seeded from (class, index), so the set is the
# same on every machine and run. A set of N images lives in <cache dir>/images-N.
# --------------------------------------------------------------------------------------------

DATA_SEED = 20240601
VAL_FRACTION = 0.2
COMPLETE_MARKER = "COMPLETE.json"  # written last: a folder with it is a finished dataset


def pink_noise(rng: np.random.Generator, height: int, width: int, slope: float, stretch: float = 1.0) -> np.ndarray:
    """Noise with amplitude spectrum 1/f**slope (1 looks like natural texture, 2 like clouds),
    normalised to zero mean and unit deviation. stretch > 1 elongates features horizontally."""
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :] * stretch
    freq = np.sqrt(fx**2 + fy**2)
    freq[0, 0] = 1.0
    real, imag = rng.standard_normal((2, *freq.shape), dtype=np.float32)
    spectrum = (real + 1j * imag) / freq**slope
    spectrum[0, 0] = 0.0
    noise = np.fft.irfft2(spectrum, s=(height, width))
    return (noise - noise.mean()) / (noise.std() + 1e-8)


def profile_1d(rng: np.random.Generator, length: int, slope: float) -> np.ndarray:
    """A 1-D 1/f curve (zero mean, unit deviation): a ridge line, a shore, a tree line."""
    freq = np.fft.rfftfreq(length)
    freq[0] = 1.0
    spectrum = (rng.standard_normal(freq.shape) + 1j * rng.standard_normal(freq.shape)) / freq**slope
    spectrum[0] = 0.0
    curve = np.fft.irfft(spectrum, n=length)
    return ((curve - curve.mean()) / (curve.std() + 1e-8)).astype(np.float32)


def jitter(rng: np.random.Generator, colour, amount: float = 0.06) -> np.ndarray:
    """An RGB colour with each channel moved by up to +-amount."""
    return np.clip(np.asarray(colour) + rng.uniform(-amount, amount, 3), 0, 1).astype(np.float32)


def paint(image: np.ndarray, colour, coverage: np.ndarray) -> None:
    """Paint colour (an RGB triple or an image-shaped layer) over image, in place, where
    coverage (0..1 per pixel; fractional on edges, which anti-aliases them) is set."""
    coverage = coverage[..., None]
    image *= 1 - coverage
    image += colour * coverage


def window(lo: float, hi: float, size: int) -> slice:
    """The pixel rows (or columns) from lo to hi, clipped to the image: where to draw a shape."""
    return slice(min(max(0, int(lo) - 1), size), max(0, min(size, int(np.ceil(hi)) + 2)))


def vertical_gradient(height: int, width: int, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    t = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    return np.broadcast_to(top * (1 - t) + bottom * t, (height, width, 3)).copy()


def coast(rng, h, w, yy, xx):
    """Sky over sea, a horizon, often a beach in front."""
    sky_top, sky_low, sea = (0.35, 0.55, 0.80), (0.75, 0.82, 0.88), (0.15, 0.35, 0.50)
    if rng.random() < 0.3:  # overcast
        sky_top, sky_low, sea = (0.55, 0.58, 0.62), (0.75, 0.76, 0.78), (0.30, 0.36, 0.40)
    elif rng.random() < 0.2:  # sunset
        sky_top, sky_low, sea = (0.35, 0.35, 0.55), (0.95, 0.65, 0.40), (0.30, 0.25, 0.35)
    image = vertical_gradient(h, w, jitter(rng, sky_top), jitter(rng, sky_low))
    image += 0.05 * pink_noise(rng, h, w, 1.8)[..., None]  # clouds
    horizon = rng.uniform(0.3, 0.6) * h
    water = jitter(rng, sea) * (0.8 + 0.4 * yy / h)[..., None] + 0.06 * pink_noise(rng, h, w, 1.2, stretch=8)[..., None]
    paint(image, water, np.clip(yy - horizon + 0.5, 0, 1))
    if rng.random() < 0.7:
        shore = rng.uniform(0.65, 0.9) * h + 0.03 * h * profile_1d(rng, w, 1.5)
        sand = jitter(rng, (0.78, 0.70, 0.55)) + 0.05 * pink_noise(rng, h, w, 0.8)[..., None]
        paint(image, sand, np.clip(yy - shore + 0.5, 0, 1))
    return image


def forest(rng, h, w, yy, xx):
    """Blotchy foliage (green, sometimes autumn colours), tree trunks, a forest floor."""
    leaves = (0.20, 0.40, 0.15) if rng.random() < 0.75 else (0.60, 0.40, 0.12)
    image = jitter(rng, leaves, 0.08) * (0.75 + 0.25 * pink_noise(rng, h, w, 1.1))[..., None]
    image += 0.12 * np.clip(pink_noise(rng, h, w, 0.9) - 1.2, 0, None)[..., None]  # flecks of sunlight
    ground = rng.uniform(0.7, 0.9) * h + 0.03 * h * profile_1d(rng, w, 1.5)
    floor = jitter(rng, (0.35, 0.28, 0.18)) * (0.8 + 0.2 * pink_noise(rng, h, w, 0.7))[..., None]
    paint(image, floor, np.clip(yy - ground + 0.5, 0, 1))
    for _ in range(rng.integers(5, 16)):
        foot, half, lean = rng.uniform(0, w), rng.uniform(0.006, 0.04) * w, rng.uniform(-0.08, 0.08)
        cols = window(foot - half - abs(lean) * h, foot + half + abs(lean) * h, w)
        centre = foot + lean * (yy - h)  # the trunk's middle on each row
        across = np.clip((xx[:, cols] - centre) / half, -1.5, 1.5)  # -1..1 across the trunk
        bark = jitter(rng, (0.22, 0.17, 0.12), 0.05) * (0.8 + 0.25 * across)[..., None]
        paint(image[:, cols], bark, np.clip((1 - np.abs(across)) * half + 0.5, 0, 1))
    return image


def still_life(rng, h, w, yy, xx):
    """Round fruit with shading, highlights and shadows on a wooden table in front of a wall."""
    edge = rng.uniform(0.2, 0.45) * h
    image = vertical_gradient(h, w, jitter(rng, (0.70, 0.68, 0.62), 0.1), jitter(rng, (0.55, 0.52, 0.48), 0.1))
    grain = 0.85 + 0.15 * pink_noise(rng, h, w, 1.0, stretch=10)
    paint(image, jitter(rng, (0.50, 0.36, 0.22), 0.08) * grain[..., None], np.clip(yy - edge + 0.5, 0, 1))
    palette = [(0.75, 0.12, 0.10), (0.90, 0.50, 0.10), (0.90, 0.78, 0.20), (0.45, 0.65, 0.15), (0.45, 0.10, 0.30)]
    light = np.array([-0.5, -0.6, 0.62], dtype=np.float32)  # from the upper left, towards the viewer
    for _ in range(rng.integers(2, 7)):
        r = rng.uniform(0.06, 0.16) * min(h, w)
        cx, cy = rng.uniform(0.1, 0.9) * w, rng.uniform(edge + r, h - 0.3 * r)
        rows, cols = window(cy - r, cy + 1.4 * r, h), window(cx - r, cx + 1.6 * r, w)
        x, y = xx[:, cols], yy[rows, :]
        shadow_distance = np.sqrt(((x - cx - 0.3 * r) / (1.1 * r)) ** 2 + ((y - cy - 0.6 * r) / (0.5 * r)) ** 2)
        shadow = np.clip(1.3 - shadow_distance, 0, 1)  # soft, below and to the right
        image[rows, cols] *= (1 - 0.45 * shadow)[..., None]
        dx, dy = (x - cx) / r, (y - cy) / (0.92 * r)
        dz = np.sqrt(np.clip(1 - dx**2 - dy**2, 0, 1))
        shade = np.clip(dx * light[0] + dy * light[1] + dz * light[2], 0, 1)
        colour = jitter(rng, palette[rng.integers(len(palette))], 0.08)
        fruit = colour * (0.35 + 0.75 * shade)[..., None] + 0.5 * (shade**30)[..., None]
        paint(image[rows, cols], fruit, np.clip((1 - np.sqrt(dx**2 + dy**2)) * r + 0.5, 0, 1))
    return image


def mountains(rng, h, w, yy, xx):
    """Ridges fading into the haze layer by layer, snow on the far peaks."""
    sky_top, sky_low = (0.40, 0.55, 0.78), (0.80, 0.85, 0.90)
    if rng.random() < 0.25:  # dusk
        sky_top, sky_low = (0.45, 0.40, 0.60), (0.95, 0.70, 0.50)
    image = vertical_gradient(h, w, jitter(rng, sky_top), jitter(rng, sky_low))
    image += 0.04 * pink_noise(rng, h, w, 1.8)[..., None]
    rock_texture = (0.85 + 0.15 * pink_noise(rng, h, w, 1.0))[..., None]
    snow_patches = np.clip(0.6 + pink_noise(rng, h, w, 1.2), 0, 1)
    near = jitter(rng, (0.20, 0.25, 0.20) if rng.random() < 0.6 else (0.35, 0.30, 0.25))
    haze = np.asarray(sky_low, dtype=np.float32)
    layers = int(rng.integers(2, 5))
    for i in range(layers):
        depth = (layers - 1 - i) / (layers - 1)  # 1 = farthest
        base = (0.3 + 0.45 * i / layers + rng.uniform(-0.05, 0.05)) * h
        ridge = base + (0.12 - 0.05 * i / layers) * h * profile_1d(rng, w, rng.uniform(1.2, 1.8))
        rock = (near * (1 - 0.7 * depth) + haze * 0.7 * depth) * rock_texture
        if depth > 0.5:
            snow_line = np.clip((ridge + rng.uniform(0.04, 0.1) * h - yy) / (0.01 * h), 0, 1)
            paint(rock, jitter(rng, (0.92, 0.93, 0.95), 0.03), snow_line * snow_patches)
        paint(image, rock, np.clip(yy - ridge + 0.5, 0, 1))
    return image


def city_night(rng, h, w, yy, xx):
    """Dark buildings with lit windows under a night (or dusk) sky."""
    sky_top, sky_low = (0.03, 0.04, 0.10), (0.20, 0.15, 0.20)
    if rng.random() < 0.3:  # dusk
        sky_top, sky_low = (0.15, 0.20, 0.40), (0.60, 0.45, 0.45)
    image = vertical_gradient(h, w, jitter(rng, sky_top, 0.03), jitter(rng, sky_low, 0.05))
    for _ in range(rng.integers(5, 14)):
        left, width, top = rng.uniform(-0.1, 1.0) * w, rng.uniform(0.06, 0.22) * w, rng.uniform(0.15, 0.75) * h
        rows, cols = window(top, h, h), window(left, left + width, w)
        x, y = xx[:, cols] - left, yy[rows, :] - top  # relative to the building's top left corner
        inside = np.clip(np.minimum(x, width - x) + 0.5, 0, 1) * np.clip(y + 0.5, 0, 1)
        paint(image[rows, cols], jitter(rng, (0.12, 0.12, 0.14), 0.05), inside)
        pitch_x, pitch_y = rng.uniform(5, 11), rng.uniform(6, 13)  # one window per cell
        col, row = np.floor(x / pitch_x).astype(int), np.floor(y / pitch_y).astype(int)
        fx, fy = x / pitch_x - col, y / pitch_y - row  # position inside the cell, 0..1
        lit = rng.random((int(h / pitch_y) + 2, int(width / pitch_x) + 2)) < rng.uniform(0.15, 0.6)
        lit_here = lit[np.clip(row, 0, lit.shape[0] - 1), np.clip(col, 0, lit.shape[1] - 1)] & (row >= 1)
        pane = np.minimum(np.minimum(fx - 0.2, 0.8 - fx) * pitch_x, np.minimum(fy - 0.25, 0.8 - fy) * pitch_y)
        paint(image[rows, cols], jitter(rng, (0.95, 0.80, 0.45), 0.05), np.clip(pane + 0.5, 0, 1) * inside * lit_here)
    return image


SCENES = {"coast": coast, "forest": forest, "still_life": still_life, "mountains": mountains, "city_night": city_night}


def render(rng: np.random.Generator, scene) -> Image.Image:
    """One photo-like image of the given scene, at a random size and aspect ratio. The scene is
    drawn at half size and scaled up, which is quicker and blurs it like a soft lens."""
    long_side = int(rng.integers(400, 641))
    short_side = max(300, int(long_side / rng.uniform(1.0, 1.6)))
    width, height = (long_side, short_side) if rng.random() < 0.7 else (short_side, long_side)
    h, w = height // 2, width // 2
    yy, xx = np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None, :]
    image = scene(rng, h, w, yy, xx)
    # The camera: uneven light, vignetting, exposure, white balance, muted colours.
    u, v = xx / w - 0.5, yy / h - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    ramp = 1 + rng.uniform(0, 0.5) * (np.cos(angle) * u + np.sin(angle) * v)
    vignette = 1 - rng.uniform(0.2, 0.7) * (u**2 + v**2)
    image *= (ramp * vignette)[..., None]
    image *= (rng.uniform(0.8, 1.2) * rng.uniform(0.92, 1.08, 3)).astype(np.float32)
    grey = image.mean(axis=2, keepdims=True)
    image = grey + (image - grey) * rng.uniform(0.6, 1.0)
    if rng.random() < 0.5:
        image = image[:, ::-1]
    small = Image.fromarray((np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8))
    photo = np.asarray(small.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
    photo += rng.standard_normal(photo.shape, dtype=np.float32) * rng.uniform(1, 4)  # sensor noise
    return Image.fromarray(np.clip(photo + 0.5, 0, 255).astype(np.uint8))


def build_dataset(root: Path, num_images: int) -> None:
    """Write num_images JPEGs as root/{train,val}/<scene>/<n>.jpg, then the completion marker."""
    names = list(SCENES)
    for index, name in enumerate(names):
        count = num_images // len(names) + (index < num_images % len(names))
        val_count = min(count - 1, max(1, round(count * VAL_FRACTION)))
        for n in range(count):
            rng = np.random.default_rng([DATA_SEED, index, n])
            split = "val" if n < val_count else "train"
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            render(rng, SCENES[name]).save(folder / f"{n:04d}.jpg", quality=int(rng.integers(85, 93)))
    info = {"num_images": num_images, "classes": names, "seed": DATA_SEED}
    (root / COMPLETE_MARKER).write_text(json.dumps(info) + "\n")


def demo_dataset(cache_dir: Path, num_images: int) -> Path:
    """The demo dataset's folder, generated the first time and reused afterwards.

    It is built in a temporary sibling folder and renamed into place when complete, so an
    interrupted run leaves nothing half-made behind and two runs racing each other both end up
    using one complete copy."""
    root = cache_dir / f"images-{num_images}"
    if (root / COMPLETE_MARKER).exists():
        print(f"data: {root} (reused)", flush=True)
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    building = Path(tempfile.mkdtemp(prefix=f".{root.name}.building-", dir=cache_dir))
    try:
        build_dataset(building, num_images)
        if root.exists() and not (root / COMPLETE_MARKER).exists():
            shutil.rmtree(root, ignore_errors=True)  # an unfinished folder not made by this script
        os.rename(building, root)
    except OSError:
        if not (root / COMPLETE_MARKER).exists():  # not just another run that finished first
            raise
        print(f"data: {root} (reused: another run generated it first)", flush=True)
        return root
    finally:
        shutil.rmtree(building, ignore_errors=True)
    print(f"data: {root} (generated {num_images} images in {time.perf_counter() - started:.1f} s)", flush=True)
    return root


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def seed_worker(worker_id: int) -> None:
    """Seed numpy and random in each DataLoader worker from the worker's torch seed."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def train_one_epoch(model, loader, criterion, optimizer, scheduler) -> tuple[float, float, int, float]:
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    started = time.perf_counter()
    for images, targets in loader:
        outputs = model(images)
        loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        total_loss += loss.item() * images.size(0)
        correct += (outputs.argmax(1) == targets).sum().item()
        seen += images.size(0)
    seconds = time.perf_counter() - started
    return total_loss / seen, 100.0 * correct / seen, seen, seconds


def evaluate(model, loader, criterion) -> tuple[float, int, int]:
    """The mean loss over the loader, the images classified right and the images seen."""
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for images, targets in loader:
            outputs = model(images)
            total_loss += criterion(outputs, targets).item() * images.size(0)
            correct += (outputs.argmax(1) == targets).sum().item()
            seen += images.size(0)
    return total_loss / seen, correct, seen


def main() -> None:
    started = time.perf_counter()
    args = parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)

    data = args.data if args.data is not None else demo_dataset(args.cache_dir, args.num_images)
    if args.data is not None:
        print(f"data: {data} (given)", flush=True)

    normalize = transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    train_transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    val_transform = transforms.Compose(
        [
            transforms.Resize(round(args.image_size * 256 / 224)),
            transforms.CenterCrop(args.image_size),
            transforms.ToTensor(),
            normalize,
        ]
    )
    train_set = datasets.ImageFolder(data / "train", transform=train_transform)
    val_set = datasets.ImageFolder(data / "val", transform=val_transform)

    generator = torch.Generator()
    generator.manual_seed(args.seed)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        worker_init_fn=seed_worker,
        generator=generator,
    )
    val_loader = DataLoader(val_set, batch_size=args.batch_size, shuffle=False, num_workers=args.workers)

    model = models.resnet18(num_classes=len(train_set.classes))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    print(
        f"training resnet18 on {len(train_set)} images ({len(train_set.classes)} classes), "
        f"validating on {len(val_set)}, {args.epochs} epochs at {args.image_size} px",
        flush=True,
    )

    images_trained, train_seconds = 0, 0.0
    for epoch in range(1, args.epochs + 1):
        train_loss, train_accuracy, seen, seconds = train_one_epoch(
            model, train_loader, criterion, optimizer, scheduler
        )
        val_loss, val_correct, val_seen = evaluate(model, val_loader, criterion)
        # the count says how many images the accuracy is of: what a difference of a few points means
        val_accuracy = f"{100.0 * val_correct / val_seen:.2f}% ({val_correct}/{val_seen})"
        images_trained += seen
        train_seconds += seconds
        print(
            f"epoch {epoch}/{args.epochs}: train loss {train_loss:.4f}, train accuracy {train_accuracy:.2f}%, "
            f"val loss {val_loss:.4f}, val accuracy {val_accuracy}, {seen / seconds:.1f} images/s",
            flush=True,
        )

    print(
        f"final: train loss {train_loss:.4f}, val accuracy {val_accuracy}, "
        f"{images_trained / train_seconds:.1f} images/s, {time.perf_counter() - started:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
