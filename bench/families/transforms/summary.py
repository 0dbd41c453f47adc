"""transforms' rows and report: images/s per pipeline, size and variant against stock and albumentations."""

from __future__ import annotations

import argparse
import statistics

import harness as h

from families.decode import processes as decode_processes
from families.transforms.pipelines import ALBU, BEAT_ALBU, STOCK, TARGETS, TENSOR, TENSOR_NP, TENSOR_TARGET, size_name


def median_of(reports: list[dict], key: str, metric: str = "img_per_s") -> float:
    """Median of a metric over all samples of ``key`` ("pipeline|size|variant") in ``reports``."""
    return statistics.median(x for r in reports for x in r[metric][key])


def summarise(reports: list[dict], sizes: list[tuple[int, int]], pipelines: list[str], clock: str) -> list[dict]:
    """One row per pipeline, size and variant; rates and ratios on the ``clock`` chosen: wall time
    (img_per_s) or the process's CPU time (img_per_cpu_s)."""
    metric = "img_per_s" if clock == "wall" else "img_per_cpu_s"
    variants = list(reports[0]["implementations"])
    rows = []
    for size in sizes:
        for pipeline in pipelines:
            group = f"{pipeline}|{size_name(size)}"
            stock = median_of(reports, f"{group}|{STOCK}", metric)
            albu = median_of(reports, f"{group}|{ALBU}", metric) if ALBU in variants else None
            tensor = median_of(reports, f"{group}|{TENSOR}", metric) if TENSOR in variants else None
            for variant in variants:
                key = f"{group}|{variant}"
                samples = [x for r in reports for x in r[metric][key]]
                stats = h.spread(samples)
                x_albu = stats["median"] / albu if albu is not None and variant not in (STOCK, ALBU) else None
                rows.append(
                    h.row(
                        "transforms",
                        f"{pipeline} {size_name(size)}",
                        variant,
                        stats["median"],
                        "img/s" if clock == "wall" else "img/CPU-s",
                        stats["median"] / stock,
                        stock=variant == STOCK,
                        rates=samples,
                        cpu_share=median_of(reports, key, "cpu_share"),
                        pipeline=pipeline,
                        size=size_name(size),
                        uses=reports[0]["implementations"][variant]["uses"],
                        clock=clock,
                        img_per_s=median_of(reports, key),
                        img_per_cpu_s=median_of(reports, key, "img_per_cpu_s"),
                        x_stock_per_process=[
                            median_of([r], key, metric) / median_of([r], f"{group}|{STOCK}", metric) for r in reports
                        ],
                        iqr_pct=stats["iqr_pct"],
                        target_x_stock=TARGETS.get((variant, pipeline, size)),
                        x_albumentations=x_albu,
                        # the tensor path under nanopatch against the same path stock (the 1.3x)
                        x_tensor_path_stock=stats["median"] / tensor if variant == TENSOR_NP and tensor else None,
                        x_tensor_path_stock_per_process=[
                            median_of([r], key, metric) / median_of([r], f"{group}|{TENSOR}", metric) for r in reports
                        ]
                        if variant == TENSOR_NP and tensor
                        else None,
                        target_faster_than_albumentations=(variant, size) in BEAT_ALBU and x_albu is not None,
                        samples_img_per_s=[r["img_per_s"][key] for r in reports],
                        samples_img_per_cpu_s=[r["img_per_cpu_s"][key] for r in reports],
                        samples_cpu_share=[r["cpu_share"][key] for r in reports],
                    )
                )
    return rows


def print_report(args: argparse.Namespace, reports: list[dict], rows: list[dict], data: dict, elapsed: float) -> None:
    info = reports[0]["machine"]
    libraries = [
        f"Pillow {info['pillow']} (libjpeg_turbo {info['pillow_libjpeg_turbo_version']}), OpenCV {info['opencv']}, "
        f"albumentations {info['albumentations'] or '(not installed)'}, PyTurboJPEG {info['pyturbojpeg']}, "
        f"TorchCodec {info.get('torchcodec') or '(not installed)'}, Kornia {info.get('kornia') or '(not installed)'}"
    ]
    decode_processes.print_setup(args.cpu, reports, data, libraries)
    print("What each variant runs (class and function identity, checked in every process):")
    for variant, impl in reports[0]["implementations"].items():
        print(f"  {variant}: {impl['state']}")
        for module, names in impl["transform_classes"].items():
            print(f"      transforms  {module}: {', '.join(names)}")
        if "getitem" in impl:
            encoded = sum(impl["pipeline_gets_encoded_file"].values())
            print(f"      __getitem__ {impl['getitem']}")
            print(f"      loader      {impl['loader']}")
            print(f"      pipelines handed the file undecoded: {encoded} of {len(impl['pipeline_gets_encoded_file'])}")
            if "crop_decode" in impl:
                print(f"      crop-aware decode (RandomResizedCrop): {impl['crop_decode']}")
            if "resize_kernel" in impl:
                print(f"      bilinear resize: {impl['resize_kernel']}")
        else:
            print(f"      reads       {impl['reads']}")
    print()
    unit = "img/s" if args.clock == "wall" else "img/CPU-s"
    header = (
        f"{'pipeline':<14}{'size':<11}{'variant':<23}{unit:>10}{'IQR':>6}{'CPU':>6}{'x stock':>9}"
        f"{'per process':>13}{'target':>8}{'met':>5}{'x albu':>8}{'target':>7}{'met':>5}  uses"
    )
    print(header)
    print("-" * len(header))
    previous = None
    for row in rows:
        if previous is not None and (row["pipeline"], row["size"]) != previous:
            print()
        previous = (row["pipeline"], row["size"])
        target = row["target_x_stock"]
        met = "" if target is None else ("yes" if row["ratio_to_stock"] >= target else "no")
        spread = f"{min(row['x_stock_per_process']):.2f}-{max(row['x_stock_per_process']):.2f}"
        x_albu = "" if row["x_albumentations"] is None else f"{row['x_albumentations']:.2f}x"
        beat = row["target_faster_than_albumentations"]
        beat_met = "" if not beat else ("yes" if row["x_albumentations"] > 1 else "no")
        print(
            f"{row['pipeline']:<14}{row['size']:<11}{row['variant']:<23}{row['rate']:>10.1f}"
            f"{row['iqr_pct']:>5.0f}%{row['cpu_share'] * 100:>5.0f}%{row['ratio_to_stock']:>8.2f}x{spread:>13}"
            f"{'' if target is None else f'>={target:g}x':>8}{met:>5}{x_albu:>8}{'>1x' if beat else '':>7}"
            f"{beat_met:>5}  {row['uses']}"
        )
    print()
    passes = reports[0]["passes"]
    clock = "wall time" if args.clock == "wall" else "this process's CPU time (--clock cpu)"
    print(
        f"{unit}: images per second of {clock}, median of {args.processes} processes x {args.rounds} interleaved "
        f"rounds of dataset[i] over the ImageFolder; a sample is {min(passes.values())}-{max(passes.values())} "
        "passes over the images of a size. "
        "x stock: ratio of the medians; per process: the range of that ratio computed in each process alone. "
        "IQR = interquartile range / median of the samples. CPU = median CPU time / wall time "
        f"(below {h.BUSY_CPU_SHARE:.0%}, other processes were taking this core). x albu: ratio to albumentations."
    )
    shares = [row["cpu_share"] for row in rows]
    if args.clock == "wall" and statistics.median(shares) < h.BUSY_CPU_SHARE:
        print(
            f"Warning: other processes took this core (median CPU {statistics.median(shares) * 100:.0f}%): the "
            "wall-clock rates above are suspect; --clock cpu measures per CPU-second instead, which such sharing "
            "disturbs less (though not at all)."
        )
    print()
    print(
        "Output vs stock under the same torch.manual_seed per image (checked in every process, all images; "
        "grey levels = |diff| x std x 255):"
    )
    header = (
        f"  {'pipeline':<14}{'size':<11}{'nanopatch max / mean |diff|':>30}{'(tolerance)':>13}"
        f"{'fast decode mean / p99 / max grey':>36}{'albumentations mean / p99 grey':>34}"
        f"{'tv tensors mean / p99 / max grey':>36}{'torchcodec mean / p99 / max':>31}{'kornia mean / p99':>19}"
    )
    print(header)
    for key, check in reports[0]["checks"].items():
        pipeline, size = key.split("|")
        worst = max(r["checks"][key]["nanopatch_max_abs_diff"] for r in reports)
        nano = f"{worst:.4f} / {check['nanopatch_mean_abs_diff']:.5f}"
        fast = (
            f"{check['fast_decode_mean_grey_levels']:.2f} / {check['fast_decode_p99_grey_levels']:.1f}"
            f" / {check['fast_decode_max_grey_levels']:.0f}"
        )
        if "albumentations_mean_grey_levels" in check:
            albu = f"{check['albumentations_mean_grey_levels']:.2f} / {check['albumentations_p99_grey_levels']:.1f}"
        else:
            albu = "own RNG" if ALBU in reports[0]["implementations"] else ""
        tensor = ""
        if "tensor_path_mean_grey_levels" in check:
            tensor = (
                f"{check['tensor_path_mean_grey_levels']:.2f} / {check['tensor_path_p99_grey_levels']:.1f}"
                f" / {check['tensor_path_max_grey_levels']:.0f}"
            )
        codec = ""
        if "torchcodec_mean_grey_levels" in check:
            codec = (
                f"{check['torchcodec_mean_grey_levels']:.2f} / {check['torchcodec_p99_grey_levels']:.1f}"
                f" / {check['torchcodec_max_grey_levels']:.0f}"
            )
        if "kornia_mean_grey_levels" in check:
            kornia = f"{check['kornia_mean_grey_levels']:.2f} / {check['kornia_p99_grey_levels']:.1f}"
        else:
            kornia = "own RNG" if "kornia" in reports[0]["implementations"] else ""
        allowed = f"({check['tolerance']:.4f})"
        print(
            f"  {pipeline:<14}{size:<11}{nano:>30}{allowed:>13}{fast:>36}{albu:>34}{tensor:>36}{codec:>31}"
            f"{kornia:>19}".rstrip()
        )
    print()
    tensor_rows = [row for row in rows if row.get("x_tensor_path_stock") is not None]
    if tensor_rows:
        print(f"torchvision's tensor path under nanopatch against the same path stock (target >={TENSOR_TARGET:g}x):")
        for row in tensor_rows:
            ratio, spread = row["x_tensor_path_stock"], row["x_tensor_path_stock_per_process"]
            met = "yes" if ratio >= TENSOR_TARGET else "no"
            print(
                f"  {row['pipeline']:<14}{row['size']:<11}{ratio:>6.2f}x  per process "
                f"{min(spread):.2f}-{max(spread):.2f}  met: {met}"
            )
        print()
    for note in reports[0]["notes"]:
        print(f"Note: {note}.")
    total = sum(entry["images"] for entry in data.values())
    print(
        f"Targets from the issue are printed, never asserted. Verified in every process on all {total} images: "
        f"stock runs torchvision only, the nanopatch variants go through nanopatch (loader fast path taken), "
        f"nanopatch's tensors == stock's within one grey level, and the tensor path's under nanopatch == its own "
        f"stock. tv tensors: torchvision.io.decode_jpeg + transforms.v2 on uint8 tensors (another resize than "
        f"PIL's: its pixels differ from stock's by design); torchcodec: TorchCodec's decode_image and the same "
        f"transforms.v2 pipeline; kornia: kornia.io + kornia.augmentation on float tensors (batch of one), its "
        f"crops drawn its own way. Run took {elapsed:.0f} s."
    )
