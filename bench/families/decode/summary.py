"""decode's rows and report: images/s per size and variant against stock."""

from __future__ import annotations

import argparse
import statistics

import harness as h

from families.decode.dataset import MIN_SIZE, size_name
from families.decode.processes import print_setup
from families.decode.variants import STOCK, TARGETS


def summarise(reports: list[dict], paths: dict) -> list[dict]:
    rows = []
    for size in paths:
        for name in reports[0]["outputs"]:
            key, stock_key = f"{name}|{size_name(size)}", f"{STOCK}|{size_name(size)}"
            samples = [x for r in reports for x in r["img_per_s"][key]]
            stock = [x for r in reports for x in r["img_per_s"][stock_key]]
            stats = h.spread(samples)
            per_process = [
                statistics.median(r["img_per_s"][key]) / statistics.median(r["img_per_s"][stock_key]) for r in reports
            ]
            rows.append(
                h.row(
                    "decode",
                    size_name(size),
                    name,
                    stats["median"],
                    "img/s",
                    stats["median"] / statistics.median(stock),
                    stock=name == STOCK,
                    rates=samples,
                    cpu_share=statistics.median(x for r in reports for x in r["cpu_share"][key]),
                    images=len(paths[size]),
                    x_stock_per_process=per_process,
                    iqr_pct=stats["iqr_pct"],
                    page_faults_per_img=statistics.median(x for r in reports for x in r["faults"][key]),
                    target_x_stock=TARGETS.get((name, size)),
                    output=reports[0]["outputs"][name][size_name(size)],
                    samples_img_per_s=[r["img_per_s"][key] for r in reports],
                    samples_cpu_share=[r["cpu_share"][key] for r in reports],
                    samples_page_faults_per_img=[r["faults"][key] for r in reports],
                )
            )
    return rows


def print_report(args: argparse.Namespace, reports: list[dict], rows: list[dict], data: dict, elapsed: float) -> None:
    info = reports[0]["machine"]
    libraries = [
        f"Pillow {info['pillow']} (features: jpg {info['pillow_jpg']} [libjpeg API], libjpeg_turbo "
        f"{info['pillow_libjpeg_turbo']} {info['pillow_libjpeg_turbo_version']})",
        f"PyTurboJPEG {info['pyturbojpeg']} ({info['libturbojpeg']}, {info['libturbojpeg_deb'] or 'package unknown'})",
        f"OpenCV {info['opencv']} (JPEG: {info['opencv_jpeg']})",
    ]
    malloc = "glibc defaults (dynamic mmap threshold)" if args.malloc == "default" else "reuse (see --malloc)"
    print_setup(args.cpu, reports, data, libraries, f"malloc: {malloc}; ")
    for name, call in reports[0]["calls"].items():
        print(f"{name:<32}{call}")
    print()
    header = (
        f"{'variant':<32}{'size':<11}{'img/s':>8}{'IQR':>6}{'CPU':>6}{'flt/img':>8}"
        f"{'x stock':>9}{'per process':>13}{'target':>8}{'met':>5}  output"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        target = row["target_x_stock"]
        met = "" if target is None else ("yes" if row["ratio_to_stock"] >= target else "no")
        spread = f"{min(row['x_stock_per_process']):.2f}-{max(row['x_stock_per_process']):.2f}"
        out = row["output"]
        print(
            f"{row['variant']:<32}{row['group']:<11}{row['rate']:>8.1f}"
            f"{row['iqr_pct']:>5.0f}%{row['cpu_share'] * 100:>5.0f}%{row['page_faults_per_img']:>8.0f}"
            f"{row['ratio_to_stock']:>8.2f}x{spread:>13}{'' if target is None else f'>={target:g}x':>8}{met:>5}"
            f"  {out['type']} {out['width']}x{out['height']} {out['pixels']}".rstrip()
        )
    print()
    passes = reports[0]["passes"]
    samples = " / ".join(f"{n} passes over the {size}" for size, n in passes.items())
    total = sum(entry["images"] for entry in data.values())
    print(
        f"img/s: median of {args.processes} processes x {args.rounds} interleaved rounds; per variant and round one "
        f"sample of {samples} images. x stock: ratio of the medians; per process: the range of that ratio "
        "computed in each process alone. IQR = interquartile range / median of the samples. CPU = median CPU "
        f"time / wall time (below {h.BUSY_CPU_SHARE:.0%}, other processes were taking this core). flt/img = "
        "median minor page faults per image (memory freshly mapped and zeroed by the kernel on every image; "
        "see --malloc)."
    )
    print(
        f"Verified in every process on all {total} images: nanopatch loader pixels == stock, its fast path "
        f"taken, DCT-scaled output >= {MIN_SIZE[0]}x{MIN_SIZE[1]}. Run took {elapsed:.0f} s."
    )
