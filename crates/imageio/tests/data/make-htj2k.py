"""Makes the High-Throughput JPEG 2000 (HTJ2K, ISO 15444-15) test streams in this folder (run
once; the files are committed) with OpenJPH's encoder (Debian: apt install openjph-tools;
only to remake these files, not to run the tests).

The pixel patterns are the ones crates/imageio/tests/dicom_codecs.rs computes for a 16 × 12
image: gray(x, y) = (x * 13 + y * 7) % 256, gray12(x, y) = (x * 331 + y * 97) % 4096,
rgb(x, y) = (x * 16, y * 20, (x + y) * 8). Reversible (lossless) 5/3 wavelet; the RGB one
with the reversible colour transform; one lossy grey stream with the 9/7 wavelet.
Run: python3 make-htj2k.py
"""
import os
import struct
import subprocess
import tempfile

W, H = 16, 12


def pnm(path, magic, maxval, samples, wide):
    with open(path, "wb") as f:
        f.write(f"{magic}\n{W} {H}\n{maxval}\n".encode())
        if wide:
            f.write(b"".join(struct.pack(">H", v) for v in samples))
        else:
            f.write(bytes(samples))


def compress(src, out, *args):
    subprocess.run(["ojph_compress", "-i", src, "-o", out, *args], check=True)


with tempfile.TemporaryDirectory() as tmp:
    gray = os.path.join(tmp, "gray.pgm")
    pnm(gray, "P5", 255, [(x * 13 + y * 7) % 256 for y in range(H) for x in range(W)], False)
    compress(gray, "gray8-htj2k-lossless.j2c", "-reversible", "true", "-num_decomps", "2")
    compress(gray, "gray8-htj2k-lossy.j2c", "-qstep", "0.01", "-num_decomps", "2")
    g12 = os.path.join(tmp, "gray12.pgm")
    pnm(g12, "P5", 4095, [(x * 331 + y * 97) % 4096 for y in range(H) for x in range(W)], True)
    compress(g12, "gray12-htj2k-lossless.j2c", "-reversible", "true", "-num_decomps", "2")
    rgb = os.path.join(tmp, "rgb.ppm")
    px = [v for y in range(H) for x in range(W) for v in (x * 16, y * 20, (x + y) * 8)]
    pnm(rgb, "P6", 255, px, False)
    compress(rgb, "rgb8-htj2k-lossless.j2c", "-reversible", "true", "-colour_trans", "true",
             "-num_decomps", "2")
