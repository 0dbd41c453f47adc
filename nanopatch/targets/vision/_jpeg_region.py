"""A crop-aware JPEG decode through libjpeg's own API: only the rows down to a box's bottom read
from the file, only its columns inverse-transformed, upsampled and converted.

libjpeg-turbo has had partial decompression in its libjpeg API since 1.5 (``jpeg_crop_scanline``,
``jpeg_skip_scanlines``), years before its TurboJPEG API got ``tj3SetCroppingRegion`` (3.0). Most
Linux distributions still ship 2.1, so the TurboJPEG 3 region decoder in :mod:`.decode` rarely
loads there. This module is the same decode for them: a few lines of C against the system's
``jpeglib.h``, compiled once into nanopatch's cache folder by :func:`nanopatch.foundation.compiled.compiled` (with the
system's C compiler, linked with ``-ljpeg``) and called through ctypes. It also stops at the
box's bottom (``jpeg_abort_decompress``) where TurboJPEG 3 entropy-decodes the rest of the file
to skip it, so it saves more.

It reads the image as a full decode does, with the accurate integer IDCT and fancy upsampling
(Pillow's settings), starting one iMCU above and left of the box (the margin
:func:`.decode.padded_region` explains: libjpeg-turbo treats a region's edges as image edges for
the chroma upsampling and after a skip) and one iMCU right of it, and copies the box out of each
row. So the box is the very pixels of the whole decode cut there; :mod:`.decode` checks that on
first use, and drops it (logged once) where it does not hold.

It declines (the caller then decodes the whole image and cuts the box) progressive JPEGs, those
of another precision than 8 bits or another colour space than YCbCr or grey, boxes outside the
image, files with markers inside the scan data below the box (where the whole decode might fail: the same rule as
:func:`.decode.scan_is_clean`), and anything on which libjpeg warns or fails in the rows it reads
(down to the end of the file where the box reaches the image's bottom). Corrupt entropy data
below the box only warns in a whole decode and changes only the pixels decoded after it, so the
box is the whole decode's pixels there too.

Where ``jpeglib.h`` is not installed (Debian/Ubuntu: ``libjpeg-dev``; Fedora:
``libjpeg-turbo-devel``), the system's libjpeg is not libjpeg-turbo >= 1.5, or there is no
compiler, boxes are cut from whole decodes as before, and ``--info`` says why.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from nanopatch.foundation.compiled import compiled

SOURCE = r"""
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <jpeglib.h>

#if JPEG_LIB_VERSION >= 70
#define NP_DCT_H(info) ((info).min_DCT_h_scaled_size)
#define NP_DCT_V(info) ((info).min_DCT_v_scaled_size)
#else
#define NP_DCT_H(info) ((info).min_DCT_scaled_size)
#define NP_DCT_V(info) ((info).min_DCT_scaled_size)
#endif

struct np_error { struct jpeg_error_mgr pub; jmp_buf jump; int warned; };

static void np_error_exit(j_common_ptr info) { longjmp(((struct np_error *)info->err)->jump, 1); }
static void np_emit_message(j_common_ptr info, int level) {
    if (level < 0) ((struct np_error *)info->err)->warned = 1;
}
static void np_output_message(j_common_ptr info) { (void)info; }

/* 1 where the entropy-coded data after the first SOS holds only stuffed zeros, fill bytes and
   restart markers up to the final EOI (zero padding after it allowed): decode.scan_is_clean. */
int nanopatch_scan_is_clean(const unsigned char *data, size_t size) {
    size_t pos = 2, end = size;
    for (;;) {
        if (pos + 4 > size || data[pos] != 0xFF) return 0;
        unsigned char marker = data[pos + 1];
        if (marker == 0xFF) { pos += 1; continue; }
        if (marker == 0xD8 || marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD7)) return 0;
        pos += 2 + (((size_t)data[pos + 2] << 8) | data[pos + 3]);
        if (marker == 0xDA) break;
    }
    while (end > 0 && data[end - 1] == 0) end--;
    if (end < 2 || pos >= end - 2) return 1;
    const unsigned char *p = data + pos, *stop = data + end - 2;
    while (p + 1 < stop) {
        const unsigned char *found = memchr(p, 0xFF, (size_t)(stop - 1 - p));
        if (found == NULL) break;
        unsigned char next = found[1];
        if (!(next == 0 || next == 0xFF || (next >= 0xD0 && next <= 0xD7))) return 0;
        p = found + 1;
    }
    return 1;
}

/* The box (top, left, bh, bw) of the image decoded at 1/denom into out (bh rows of bw pixels,
   stride bytes apart), read from one iMCU (times margin) above and left of it and to one iMCU
   right of it. Returns 0 when done; 1 when it declines the file or the box; 2 when libjpeg
   warned; -1 when libjpeg failed. */
int nanopatch_jpeg_region(const unsigned char *data, size_t size, int denom, int top, int left, int bh, int bw,
                          int gray, int margin, unsigned char *out, ptrdiff_t stride) {
    struct jpeg_decompress_struct info;
    struct np_error error;
    unsigned char *volatile row = NULL;
    int status = 0;
    memset(&info, 0, sizeof info);
    info.err = jpeg_std_error(&error.pub);
    error.pub.error_exit = np_error_exit;
    error.pub.emit_message = np_emit_message;
    error.pub.output_message = np_output_message;
    error.warned = 0;
    if (setjmp(error.jump)) {
        free(row);
        jpeg_destroy_decompress(&info);
        return -1;
    }
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, (unsigned char *)data, (unsigned long)size);
    jpeg_read_header(&info, TRUE);
    if (info.progressive_mode || info.data_precision != 8 ||
        !(info.jpeg_color_space == JCS_YCbCr || info.jpeg_color_space == JCS_GRAYSCALE) ||
        (gray && info.jpeg_color_space != JCS_GRAYSCALE) || error.warned) {
        jpeg_destroy_decompress(&info);
        return error.warned ? 2 : 1;
    }
    info.scale_num = 1;
    info.scale_denom = (unsigned int)denom;
    info.dct_method = JDCT_ISLOW;
    info.do_fancy_upsampling = TRUE;
    info.do_block_smoothing = TRUE;
    info.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_calc_output_dimensions(&info);
    int height = (int)info.output_height, width = (int)info.output_width;
    if (bh <= 0 || bw <= 0 || top < 0 || left < 0 || top + bh > height || left + bw > width) {
        jpeg_destroy_decompress(&info);
        return 1;
    }
    int mcu_h = info.max_v_samp_factor * NP_DCT_V(info), mcu_w = info.max_h_samp_factor * NP_DCT_H(info);
    if (info.num_components == 1) {
        mcu_h = NP_DCT_V(info);
        mcu_w = NP_DCT_H(info);
    }
    int y0 = (top / mcu_h - margin) * mcu_h, x0 = (left / mcu_w - margin) * mcu_w;
    int x1 = left + bw + margin * mcu_w;
    if (y0 < 0) y0 = 0;
    if (x0 < 0) x0 = 0;
    if (x1 > width) x1 = width;
    if (top + bh < height && !nanopatch_scan_is_clean(data, size)) {
        jpeg_destroy_decompress(&info);
        return 1;  /* it would stop before data on which the whole decode might fail */
    }
    jpeg_start_decompress(&info);
    JDIMENSION xoffset = (JDIMENSION)x0, cropped = (JDIMENSION)(x1 - x0);
    if (x0 > 0 || x1 < width) jpeg_crop_scanline(&info, &xoffset, &cropped);
    if ((int)xoffset > left || (int)(xoffset + cropped) < left + bw) {
        jpeg_abort_decompress(&info);
        jpeg_destroy_decompress(&info);
        return 1;
    }
    int channels = info.output_components;
    row = malloc((size_t)info.output_width * (size_t)channels);
    if (row == NULL) {
        jpeg_destroy_decompress(&info);
        return -1;
    }
    if (y0 > 0 && (int)jpeg_skip_scanlines(&info, (JDIMENSION)y0) != y0) status = 1;
    JSAMPROW rows[1] = {row};
    for (int y = y0; status == 0 && y < top + bh; y++) {
        if (jpeg_read_scanlines(&info, rows, 1) != 1) {
            status = 1;
            break;
        }
        if (y >= top)
            memcpy(out + (ptrdiff_t)(y - top) * stride, row + (size_t)(left - (int)xoffset) * channels,
                   (size_t)bw * channels);
    }
    /* down to the image's bottom: read on to the EOI, as the whole decode does, to hear its warnings */
    if (status == 0 && top + bh == height) jpeg_finish_decompress(&info);
    else jpeg_abort_decompress(&info);
    if (status == 0 && error.warned) status = 2;
    free(row);
    row = NULL;
    jpeg_destroy_decompress(&info);
    return status;
}
"""

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def _load() -> tuple[Any, str]:
    lib, reason = compiled("jpeg-region", SOURCE, ("-ljpeg",))
    if lib is None:
        return None, reason
    p, size, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    region = lib.nanopatch_jpeg_region
    region.argtypes = [p, size, i32, i32, i32, i32, i32, i32, i32, p, ctypes.c_ssize_t]
    region.restype = i32
    clean = lib.nanopatch_scan_is_clean
    clean.argtypes = [p, size]
    clean.restype = i32
    return (region, clean), reason


def functions() -> tuple[tuple[Any, Any] | None, str]:
    """((the region function, the scan check), where it is kept) or (None, why not); built and
    loaded once per process."""
    with _lock:
        if "made" not in _loaded:
            _loaded["made"] = _load()
        return _loaded["made"]


class CompiledRegion:
    """``decode(data, factor, box, gray)``: the box's pixels of the image decoded at 1/``factor``,
    or None when this file or box is not for it (then the whole image is decoded and the box cut
    from it). ``margin``: iMCUs read around the box (1; 0 only to show that it is needed)."""

    name = "libjpeg (jpeg_crop_scanline, compiled by nanopatch)"
    margin = 1

    def __init__(self, region: Any, clean: Any) -> None:
        self._region = region
        self._clean = clean

    def decode(self, data, factor: int, box: tuple[int, int, int, int], gray: bool) -> np.ndarray | None:
        top, left, height, width = box
        if height <= 0 or width <= 0:
            return None
        src = np.frombuffer(data, dtype=np.uint8)
        channels = 1 if gray else 3
        out = np.empty((height, width, channels), dtype=np.uint8)
        status = self._region(
            src.ctypes.data, src.size, factor, top, left, height, width, int(gray), self.margin,
            out.ctypes.data, width * channels,
        )  # fmt: skip
        if status != 0:
            return None
        return out[:, :, 0] if gray else out

    def scan_is_clean(self, data) -> bool:
        src = np.frombuffer(data, dtype=np.uint8)
        return bool(self._clean(src.ctypes.data, src.size))
