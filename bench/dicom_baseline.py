"""Baseline of `blobstream bench dicom`: makes one DICOM file per transfer syntax (a 512 x 512
CT-like 12-bit slice; an 8-bit one for JPEG Baseline, and a 640 x 480 ultrasound-like colour
frame in YBR_FULL_422) in the directory given, then times
pydicom decoding each (`dcmread(...).pixel_array`, with its pylibjpeg, openjpeg, RLE and
JPEG-LS plugins) and prints one JSON line per file:
{"syntax", "uid", "file", "size", "pixel_bytes", "seconds": [...]}.

    python dicom_baseline.py --phantom DIR   # writes DIR/phantom12.raw (512 x 512, u16 LE)
    python dicom_baseline.py DIR RUNS

The 12-bit lossy and the lossless JPEG streams no Python package here can write are made by
the bench (libjpeg-turbo) from phantom12.raw, as DIR/<name>.jpg (see JPEG12 below); each
present is wrapped into a DICOM file here like the others.
"""

import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    CTImageStorage,
    ExplicitVRLittleEndian,
    JPEG2000,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    JPEGLossless,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
    generate_uid,
)

SIZE = 512

# The bench's own 12-bit JPEG streams of the phantom: file name, syntax, UID.
JPEG12 = (
    ("jpeg-extended-12.jpg", "JPEG Extended (12-bit)", JPEGExtended12Bit),
    ("jpeg-lossless.jpg", "JPEG Lossless (predictor 6)", JPEGLossless),
    ("jpeg-lossless-sv1.jpg", "JPEG Lossless SV1", JPEGLosslessSV1),
)


def phantom(bits: int) -> np.ndarray:
    """A head-like phantom with noise, deterministic."""
    y, x = np.mgrid[-1:1:SIZE * 1j, -1:1:SIZE * 1j]
    img = np.where(x * x / 0.69**2 + y * y / 0.92**2 <= 1, 1100.0, 0.0)
    img = np.where(x * x / 0.66**2 + (y + 0.02) ** 2 / 0.87**2 <= 1, 1060.0, img)
    img = np.where((x - 0.22) ** 2 / 0.11**2 + y * y / 0.31**2 <= 1, 1040.0, img)
    rng = np.random.default_rng(7)
    img = img + np.where(img > 0, rng.normal(0, 6, img.shape), 0)
    top = (1 << bits) - 1
    return np.clip(img * top / 1200.0, 0, top).astype(np.uint16 if bits > 8 else np.uint8)


COLOUR = (480, 640)


def colour_phantom() -> np.ndarray:
    """An ultrasound-like colour frame (rows x columns x RGB), deterministic."""
    rows, cols = COLOUR
    y, x = np.mgrid[0:rows, 0:cols]
    rng = np.random.default_rng(11)
    speckle = rng.gamma(2.0, 40.0, (rows, cols))
    sector = ((x - cols / 2) ** 2 + (y + 40) ** 2 < (rows * 1.05) ** 2) & (abs(x - cols / 2) < y + 60)
    grey = np.where(sector, np.clip(speckle, 0, 255), 0)
    doppler = ((x - 380) ** 2 + (y - 220) ** 2) < 60**2
    rgb = np.stack([grey, grey, grey], -1)
    rgb[doppler] = np.stack([grey[doppler] * 0.3 + 170, grey[doppler] * 0.2, grey[doppler] * 0.3 + 40], -1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def dataset(pixels: np.ndarray, bits_stored: int) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = CTImageStorage
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.SOPClassUID = CTImageStorage
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.Modality, ds.PatientName, ds.PatientID = "CT", "Bench^Decode", "BENCH"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 16 if pixels.dtype == np.uint16 else 8
    ds.BitsStored, ds.HighBit, ds.PixelRepresentation = bits_stored, bits_stored - 1, 0
    ds.PixelData = pixels.tobytes()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return ds


def write(ds: Dataset, path: Path) -> None:
    ds.save_as(path, enforce_file_format=True)


def make(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    ct = phantom(12)
    files = []
    f = out / "native.dcm"
    write(dataset(ct, 12), f)
    files.append(("Explicit VR Little Endian", str(ExplicitVRLittleEndian), f))
    for name, uid in (("RLE Lossless", RLELossless), ("JPEG-LS Lossless", JPEGLSLossless), ("JPEG 2000 Lossless", JPEG2000Lossless)):
        ds = dataset(ct, 12)
        ds.compress(uid)
        f = out / f"{name.replace(' ', '-').lower()}.dcm"
        write(ds, f)
        files.append((name, str(uid), f))
    # Lossy and near-lossless, by the plugins' own encoders: OpenJPEG at 10:1, CharLS with
    # an error bound of 2.
    for name, uid, opts in (
        ("JPEG-LS Near-Lossless", JPEGLSNearLossless, {"jls_error": 2}),
        ("JPEG 2000", JPEG2000, {"j2k_cr": [10]}),
    ):
        ds = dataset(ct, 12)
        ds.compress(uid, **opts)
        f = out / f"{name.replace(' ', '-').lower()}.dcm"
        write(ds, f)
        files.append((name, str(uid), f))
    # JPEG Baseline: an 8-bit slice encoded by Pillow (libjpeg), encapsulated.
    ct8 = phantom(8)
    buf = io.BytesIO()
    Image.fromarray(ct8).save(buf, format="JPEG", quality=90)
    f = out / "jpeg-baseline.dcm"
    write(encapsulated(dataset(ct8, 8), buf.getvalue(), JPEGBaseline8Bit), f)
    files.append(("JPEG Baseline (8-bit)", str(JPEGBaseline8Bit), f))
    # Colour JPEG Baseline as ultrasound stores it: YBR_FULL_422 (Pillow's 4:2:2, JFIF).
    buf = io.BytesIO()
    Image.fromarray(colour_phantom()).save(buf, format="JPEG", quality=90, subsampling=1)
    ds = dataset(ct8, 8)
    ds.Rows, ds.Columns = COLOUR
    ds.SamplesPerPixel, ds.PlanarConfiguration = 3, 0
    ds.PhotometricInterpretation = "YBR_FULL_422"
    f = out / "jpeg-baseline-colour.dcm"
    write(encapsulated(ds, buf.getvalue(), JPEGBaseline8Bit), f)
    files.append(("JPEG Baseline (8-bit), colour YBR_FULL_422", str(JPEGBaseline8Bit), f))
    for stream, name, uid in JPEG12:
        if (out / stream).exists():
            f = out / stream.replace(".jpg", ".dcm")
            write(encapsulated(dataset(ct, 12), (out / stream).read_bytes(), uid), f)
            files.append((name, str(uid), f))
    return files


def encapsulated(ds: Dataset, frame: bytes, uid) -> Dataset:
    """`ds` with `frame` as its one encapsulated frame, in transfer syntax `uid`."""
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.file_meta.TransferSyntaxUID = uid
    return ds


def main():
    if sys.argv[1] == "--phantom":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        phantom(12).astype("<u2").tofile(out / "phantom12.raw")
        return
    out, runs = Path(sys.argv[1]), int(sys.argv[2])
    for name, uid, f in make(out):
        times = []
        for _ in range(runs + 1):
            t = time.perf_counter()
            arr = pydicom.dcmread(f).pixel_array
            times.append(time.perf_counter() - t)
        print(json.dumps({
            "syntax": name,
            "uid": uid,
            "file": str(f),
            "size": f"{arr.shape[1]} × {arr.shape[0]}",
            "pixel_bytes": int(arr.nbytes),
            "seconds": times[1:],
        }), flush=True)


if __name__ == "__main__":
    main()
