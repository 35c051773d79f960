"""Makes the JPEG 2000 test streams in this folder (run once; the files are committed).

The pixel patterns are the ones crates/imageio/tests/dicom_codecs.rs computes:
gray(x, y) = (x * 13 + y * 7) % 256, gray12(x, y) = (x * 331 + y * 97) % 4096,
rgb(x, y) = (x * 16, y * 20, (x + y) * 8) for a 16 × 12 image.
Needs Pillow (with its bundled OpenJPEG): python3 make-j2k.py
"""
from PIL import Image

W, H = 16, 12
gray = Image.new("L", (W, H))
gray.putdata([(x * 13 + y * 7) % 256 for y in range(H) for x in range(W)])
gray.save("gray8-lossless.j2k", irreversible=False)
gray.save("gray8-lossless.jp2", irreversible=False)

g12 = Image.new("I;16", (W, H))
g12.putdata([(x * 331 + y * 97) % 4096 for y in range(H) for x in range(W)])
g12.save("gray16-lossless.j2k", irreversible=False)

rgb = Image.new("RGB", (W, H))
rgb.putdata([(x * 16, y * 20, (x + y) * 8) for y in range(H) for x in range(W)])
rgb.save("rgb8-rct-lossless.j2k", irreversible=False, mct=1)
rgb.save("rgb8-ict-lossy.j2k", irreversible=True, mct=1, quality_mode="dB", quality_layers=[45])
