#!/usr/bin/env python3
"""Baselines for `blobstream bench filters`: the nearest OpenCV and Pillow equivalents of
blobstream's filters, timed on the same raw image the Rust side timed.

Usage: filters_baseline.py RAW WIDTH HEIGHT CHANNELS DEPTH RUNS THREADS WARM_UP FILTER...
  RAW       samples, row-major, channels interleaved (DEPTH 8: u8; DEPTH 16: u16 little-endian)
  THREADS   OpenCV threads (1, or 0 for all cores); Pillow is single-threaded and is measured
            only when THREADS is 1
  WARM_UP   seconds each filter is called before it is timed (at least once): the Rust side's
            WARM_UP (crates/bench/src/filters/mod.rs), which says why
Prints one JSON object: {"results": [{"filter", "impl", "threads", "mpix_per_s"}],
                         "missing": [{"filter", "impl", "reason"}]}
"""

import json
import os
import sys
import time

import numpy as np

try:
    import cv2
except ImportError:  # reported per filter below
    cv2 = None
try:
    from PIL import Image, ImageFilter
except ImportError:
    Image = None


def median_seconds(fn, runs, warm_up):
    warm = time.perf_counter()
    fn()
    while time.perf_counter() - warm < warm_up:
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    n = len(times)
    # The same median as the Rust side: the mean of the middle two for an even count.
    return times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2


def opencv_ops(img):
    """filter name -> zero-argument callable, for what OpenCV has an equivalent of."""
    depth16 = img.dtype == np.uint16
    mid = 32768 if depth16 else 128
    diff = np.array([-1, 0, 1], np.float32)
    ones = np.array([1, 1, 1], np.float32)
    emboss = np.array([[-2, -1, 0], [-1, 0, 1], [0, 1, 2]], np.float32) / 8.0
    h, w = img.shape[:2]

    zeros = np.zeros(img.shape, np.float32)

    def edge():
        # Prewitt H and V, max(|H|, |V|) / 3: the definition blobstream's edge filter uses.
        # Prewitt is separable: OpenCV's fastest form of it.
        if depth16:
            gx = cv2.sepFilter2D(img, cv2.CV_32F, diff, ones)
            gy = cv2.sepFilter2D(img, cv2.CV_32F, ones, diff)
            return cv2.max(cv2.absdiff(gx, zeros), cv2.absdiff(gy, zeros))
        gx = cv2.sepFilter2D(img, cv2.CV_16S, diff, ones)
        gy = cv2.sepFilter2D(img, cv2.CV_16S, ones, diff)
        return cv2.max(cv2.convertScaleAbs(gx, alpha=1 / 3), cv2.convertScaleAbs(gy, alpha=1 / 3))

    def emboss_gray():
        e = cv2.filter2D(img, -1, emboss, delta=mid)
        return cv2.cvtColor(e, cv2.COLOR_RGB2GRAY) if e.ndim == 3 else e

    def pixelize():
        small = cv2.resize(img, (max(1, w // 4), max(1, h // 4)), interpolation=cv2.INTER_AREA)
        return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)

    return {
        "blur": lambda: cv2.blur(img, (3, 3)),
        "despeckle": lambda: cv2.medianBlur(img, 3),
        # 4·v − 3·mean3×3(v): blobstream's sharpen at its default amount, per channel.
        "sharpen": lambda: cv2.addWeighted(img, 4.0, cv2.blur(img, (3, 3)), -3.0, 0),
        "edge": edge,
        "emboss": emboss_gray,
        "pixelize": pixelize,
    }


def pillow_ops(img):
    if img.dtype == np.uint16:
        return {}  # Pillow's filters do not take 16-bit images
    pil = Image.fromarray(img)
    w, h = pil.size
    return {
        "blur": lambda: pil.filter(ImageFilter.BoxBlur(1)),
        "despeckle": lambda: pil.filter(ImageFilter.MedianFilter(3)),
        "sharpen": lambda: pil.filter(ImageFilter.SHARPEN),
        "edge": lambda: pil.filter(ImageFilter.FIND_EDGES),
        "emboss": lambda: pil.filter(ImageFilter.EMBOSS),
        "oilpaint": lambda: pil.filter(ImageFilter.ModeFilter(5)),
        "pixelize": lambda: pil.resize((max(1, w // 4), max(1, h // 4)), Image.BOX).resize(
            (w, h), Image.NEAREST
        ),
        "spread": lambda: pil.effect_spread(5),
    }


def main():
    raw, width, height, channels, depth, runs, threads, warm_up = sys.argv[1:9]
    filters = sys.argv[9:]
    warm_up = float(warm_up)
    width, height, channels, runs, threads = map(int, (width, height, channels, runs, threads))
    dtype = np.uint16 if depth == "16" else np.uint8
    img = np.fromfile(raw, dtype=dtype)
    img = img.reshape((height, width, channels)) if channels > 1 else img.reshape((height, width))
    mpix = width * height / 1e6
    results, missing = [], []
    impls = []
    if cv2 is not None:
        cv2.setNumThreads(os.cpu_count() if threads == 0 else 1)
        impls.append(("opencv", opencv_ops(img)))
    else:
        missing.append({"filter": "*", "impl": "opencv", "reason": "not installed"})
    if Image is not None and threads == 1:
        impls.append(("pillow", pillow_ops(img)))
    elif Image is None:
        missing.append({"filter": "*", "impl": "pillow", "reason": "not installed"})
    for name, ops in impls:
        for f in filters:
            op = ops.get(f)
            if op is None:
                missing.append({"filter": f, "impl": name, "reason": "no equivalent"})
                continue
            secs = median_seconds(op, runs, warm_up)
            results.append({"filter": f, "impl": name, "threads": threads, "mpix_per_s": mpix / secs})
    json.dump({"results": results, "missing": missing}, sys.stdout)


if __name__ == "__main__":
    main()
