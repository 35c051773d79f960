"""blobstream's DICOMweb through a real third-party client, dicomweb-client (run by
scripts/dicomweb-tests with the server's /dicomweb URL as the argument).

Checks: STOW-RS of a 3-slice CT series made with pydicom; QIDO-RS at study, series and
instance level, with matching keys and refusal of unknown ones; WADO-RS of an instance (its
bytes and pixels unchanged), a series, study metadata, frames and a rendered PNG; WADO-URI;
an instance whose pixels cannot be decoded stored, found and retrieved all the same, and a
study of only a structured report found by patient and modality; paging with PS3.18's Warning;
406 for a search or metadata request that takes only XML;
STOW-RS of a body with a non-DICOM part (the good part kept, the bad one listed as failed), of
a part for another study, and of a body without a boundary; 404 for unknown UIDs.
"""

import io
import sys

import numpy as np
import pydicom
import requests
from dicomweb_client.api import DICOMwebClient
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

BASE = sys.argv[1].rstrip("/")
client = DICOMwebClient(url=BASE)
STUDY = generate_uid()
SERIES = generate_uid()


def ct_slice(n: int) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = CTImageStorage
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.SOPClassUID = CTImageStorage
    ds.StudyInstanceUID = STUDY
    ds.SeriesInstanceUID = SERIES
    ds.PatientName = "Client^Test"
    ds.PatientID = "DWC-0001"
    ds.StudyDate = "20251124"
    ds.AccessionNumber = "DWC-ACC"
    ds.StudyDescription = "DICOMWEB CLIENT TEST"
    ds.Modality = "CT"
    ds.SeriesNumber = 3
    ds.InstanceNumber = n
    ds.ImagePositionPatient = [0, 0, 2.5 * n]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.Rows, ds.Columns = 8, 12
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
    ds.PixelRepresentation = 0
    ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
    pixels = (np.arange(96, dtype=np.uint16).reshape(8, 12) * 37 + n * 100) % 4096
    ds.PixelData = pixels.tobytes()
    return ds


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


slices = [ct_slice(n) for n in (3, 1, 2)]
answer = client.store_instances(slices)
refs = answer.get("ReferencedSOPSequence", [])
check(len(refs) == 3 and "FailedSOPSequence" not in answer, "STOW-RS stores the 3 instances")
check(all(r.RetrieveURL.endswith(r.ReferencedSOPInstanceUID) for r in refs), "each with its RetrieveURL")

studies = client.search_for_studies(search_filters={"PatientID": "DWC-0001"})
check(len(studies) == 1, "QIDO-RS finds the study by PatientID")
study = Dataset.from_json(studies[0])
check(study.StudyInstanceUID == STUDY, "… with its Study Instance UID")
check(study.NumberOfStudyRelatedInstances == 3, "… and 3 related instances")
check(str(study.PatientName) == "Client^Test", "… and the patient's name")
check(len(client.search_for_studies(search_filters={"PatientName": "client*"})) == 1, "PatientName with a wildcard")
check(len(client.search_for_studies(search_filters={"StudyDate": "20251101-20251130"})) == 1, "StudyDate range")
check(client.search_for_studies(search_filters={"StudyDate": "20240101-20240131", "PatientID": "DWC-0001"}) == [], "a range that excludes it")
check(len(client.search_for_studies(search_filters={"AccessionNumber": "dwc-a*"})) == 1, "AccessionNumber with a wildcard")
check(len(client.search_for_studies(search_filters={"StudyDescription": "*CLIENT TEST"})) == 1, "StudyDescription with a wildcard")
check(client.search_for_studies(search_filters={"PatientID": "DWC-00?2"}) == [], "a PatientID pattern that matches nothing")

# UID lists (the key repeated, as dicomweb-client sends a list, or separated by commas) and a
# multi-valued ModalitiesInStudy match any of their values.
check(len(client.search_for_studies(search_filters={"StudyInstanceUID": [STUDY, generate_uid()]})) == 1,
      "StudyInstanceUID given as a list")
r = requests.get(f"{BASE}/studies", params={"StudyInstanceUID": f"{STUDY},1.2.3"})
check(r.status_code == 200 and len(r.json()) == 1, "… and as a comma-separated list")
r = requests.get(f"{BASE}/studies", params={"ModalitiesInStudy": "MR\\CT", "PatientID": "DWC-0001"})
check(r.status_code == 200 and len(r.json()) == 1, "ModalitiesInStudy with two values")
r = requests.get(f"{BASE}/studies", params={"ModalitiesInStudy": "MR\\US", "PatientID": "DWC-0001"})
check(r.status_code == 200 and r.json() == [], "… neither of them the study's: no match")
r = requests.get(f"{BASE}/studies", params=[("PatientID", "a"), ("PatientID", "b")])
check(r.status_code == 400, "another key given twice is refused")

series = client.search_for_series(STUDY)
check(len(series) == 1 and Dataset.from_json(series[0]).SeriesInstanceUID == SERIES, "QIDO-RS series of the study")
instances = client.search_for_instances(STUDY, SERIES)
order = [Dataset.from_json(i).InstanceNumber for i in instances]
check(all(Dataset.from_json(i).SOPClassUID == CTImageStorage for i in instances), "… each with its SOP Class UID")
check(order == [1, 2, 3], f"QIDO-RS instances in slice order ({order})")

first = slices[1]
got = client.retrieve_instance(STUDY, SERIES, first.SOPInstanceUID)
check(got.SOPInstanceUID == first.SOPInstanceUID, "WADO-RS retrieves the instance")
check(got.PixelData == first.PixelData, "… with its pixel data unchanged")
check(len(client.retrieve_series(STUDY, SERIES)) == 3, "WADO-RS retrieves the series")
anyts = client.retrieve_instance(STUDY, SERIES, first.SOPInstanceUID, media_types=(("application/dicom", "*"),))
check(anyts.PixelData == first.PixelData, "… with transfer-syntax=* (as stored)")
same = client.retrieve_instance(
    STUDY, SERIES, first.SOPInstanceUID, media_types=(("application/dicom", ExplicitVRLittleEndian),)
)
check(same.SOPInstanceUID == first.SOPInstanceUID, "… with its stored transfer syntax named")
try:
    client.retrieve_instance(
        STUDY, SERIES, first.SOPInstanceUID, media_types=(("application/dicom", "1.2.840.10008.1.2.4.90"),)
    )
    check(False, "another transfer syntax is refused")
except requests.exceptions.HTTPError as e:
    check(e.response.status_code == 406 and "stored as" in e.response.text,
          f"… and another transfer syntax is 406, not a file in the wrong one ({e.response.status_code})")
meta = client.retrieve_study_metadata(STUDY)
check(len(meta) == 3 and all("00080018" in m for m in meta), "WADO-RS study metadata")
m = Dataset.from_json(meta[0])
check(
    (m.SamplesPerPixel, m.BitsStored, m.PixelRepresentation, m.Rows, m.Columns) == (1, 12, 0, 8, 12),
    "… with the image pixel attributes",
)
check((float(m.RescaleIntercept), float(m.RescaleSlope)) == (-1024.0, 1.0), "… and the rescale")
check(m.BitsAllocated == 16, "… and the frames' sample width (BitsAllocated)")

# A colour instance stored as YBR_FULL: its frames go out decoded as RGB, and its metadata
# says so (a viewer reading YBR_FULL there would convert them a second time).
from pydicom.pixels import convert_color_space
colour = ct_slice(9)
colour.SOPInstanceUID = generate_uid()
colour.file_meta.MediaStorageSOPInstanceUID = colour.SOPInstanceUID
colour.StudyInstanceUID = COLOUR_STUDY = generate_uid()
colour.SeriesInstanceUID = COLOUR_SERIES = generate_uid()
colour.Modality = "US"
del colour.RescaleIntercept, colour.RescaleSlope
colour.SamplesPerPixel, colour.PlanarConfiguration = 3, 0
colour.PhotometricInterpretation = "YBR_FULL"
colour.BitsAllocated, colour.BitsStored, colour.HighBit = 8, 8, 7
rgb = np.zeros((8, 12, 3), dtype=np.uint8)
rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, np.arange(12) * 20, np.arange(8)[:, None] * 30
ybr = convert_color_space(rgb, "RGB", "YBR_FULL")
colour.PixelData = ybr.tobytes()
answer = client.store_instances([colour])
check(len(answer.get("ReferencedSOPSequence", [])) == 1, "STOW-RS stores a YBR_FULL colour instance")
cm = Dataset.from_json(client.retrieve_series_metadata(COLOUR_STUDY, COLOUR_SERIES)[0])
check(
    (cm.PhotometricInterpretation, cm.SamplesPerPixel, cm.PlanarConfiguration, cm.BitsAllocated)
    == ("RGB", 3, 0, 8),
    f"… its metadata describes the frames as sent: RGB, interleaved, 8 bits ({cm.PhotometricInterpretation})",
)
cf = client.retrieve_instance_frames(COLOUR_STUDY, COLOUR_SERIES, colour.SOPInstanceUID, frame_numbers=[1])
want = convert_color_space(ybr, "YBR_FULL", "RGB").astype(int)
got_rgb = np.frombuffer(cf[0], dtype=np.uint8).reshape(8, 12, 3).astype(int)
check(np.abs(got_rgb - want).max() <= 1, "… and frame 1 is those RGB samples")
frames = client.retrieve_instance_frames(STUDY, SERIES, first.SOPInstanceUID, frame_numbers=[1])
want = (np.frombuffer(first.PixelData, dtype="<u2") & 0x0FFF).astype("<u2").tobytes()
check(len(frames) == 1 and frames[0] == want, "WADO-RS frame 1: the 12-bit samples")
png = client.retrieve_instance_rendered(STUDY, SERIES, first.SOPInstanceUID, media_types=("image/png",))
check(png[:8] == b"\x89PNG\r\n\x1a\n", "WADO-RS rendered PNG")

r = requests.get(f"{BASE}/wado", params={"requestType": "WADO", "studyUID": STUDY, "seriesUID": SERIES, "objectUID": first.SOPInstanceUID})
check(r.status_code == 200 and r.headers["content-type"] == "application/dicom", "WADO-URI gives the file")
check(pydicom.dcmread(io.BytesIO(r.content)).SOPInstanceUID == first.SOPInstanceUID, "… the right one")
uri = {"requestType": "WADO", "studyUID": STUDY, "seriesUID": SERIES, "objectUID": first.SOPInstanceUID}
r = requests.get(f"{BASE}/wado", params={**uri, "transferSyntax": ExplicitVRLittleEndian})
check(r.status_code == 200, "… with its stored transferSyntax named")
r = requests.get(f"{BASE}/wado", params={**uri, "transferSyntax": "1.2.840.10008.1.2.4.50"})
check(r.status_code == 406, f"… and another transferSyntax is 406 ({r.status_code})")
r = requests.get(f"{BASE}/wado", params={"requestType": "WADO", "studyUID": STUDY, "seriesUID": SERIES, "objectUID": first.SOPInstanceUID, "contentType": "image/jpeg"})
check(r.status_code == 200 and r.content[:2] == b"\xff\xd8", "WADO-URI renders JPEG")

# Bad input: refused with the standard's status codes, the good parts kept.
r = requests.get(f"{BASE}/studies", params={"Colour": "red"})
check(r.status_code == 400, "QIDO-RS refuses an unknown query key")
r = requests.get(f"{BASE}/studies", params={"StudyDate": "2025"})
check(r.status_code == 400, "QIDO-RS refuses a malformed date")
for path in (f"/studies/{generate_uid()}", f"/studies/{STUDY}/series/{generate_uid()}/instances/{generate_uid()}"):
    check(requests.get(BASE + path).status_code == 404, f"404 for an unknown UID ({path.count('/')} levels)")

extra = ct_slice(4)
buf = io.BytesIO()
pydicom.dcmwrite(buf, extra)
boundary = "b0undary"
body = (
    f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + buf.getvalue() + b"\r\n"
    + f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + b"not a dicom file" + b"\r\n"
    + f"--{boundary}--\r\n".encode()
)
ct = f'multipart/related; type="application/dicom"; boundary={boundary}'
r = requests.post(f"{BASE}/studies", data=body, headers={"Content-Type": ct})
check(r.status_code == 202, f"a body with one bad part: 202 ({r.status_code})")
ans = Dataset.from_json(r.json())
check(len(ans.ReferencedSOPSequence) == 1 and len(ans.FailedSOPSequence) == 1, "… the good part stored, the bad one failed")
check(ans.FailedSOPSequence[0].FailureReason == 0xC000, "… with failure reason C000")
check(len(client.search_for_instances(STUDY, SERIES)) == 4, "… and the good one is searchable")

other = ct_slice(5)
other.StudyInstanceUID = generate_uid()
buf = io.BytesIO()
pydicom.dcmwrite(buf, other)
body = f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + buf.getvalue() + f"\r\n--{boundary}--\r\n".encode()
r = requests.post(f"{BASE}/studies/{STUDY}", data=body, headers={"Content-Type": ct})
check(r.status_code == 409, f"an instance of another study sent to this one: 409 ({r.status_code})")
r = requests.post(f"{BASE}/studies", data=b"x", headers={"Content-Type": "multipart/related; type=\"application/dicom\""})
check(r.status_code == 400, "a body without a boundary: 400")
r = requests.post(f"{BASE}/studies", data=b"x", headers={"Content-Type": "application/json"})
check(r.status_code == 415, "not multipart/related: 415")
# An instance whose pixels blobstream cannot decode is still stored, found and retrieved.
odd = ct_slice(6)
odd.PhotometricInterpretation = "HSV"  # retired, one sample per pixel: not decoded
answer = client.store_instances([odd])
check(len(answer.get("ReferencedSOPSequence", [])) == 1, "STOW-RS stores an instance it cannot decode")
found = client.search_for_instances(STUDY, SERIES, search_filters={"SOPInstanceUID": odd.SOPInstanceUID})
check(len(found) == 1, "… QIDO-RS finds it")
check(client.retrieve_instance(STUDY, SERIES, odd.SOPInstanceUID).PixelData == odd.PixelData, "… WADO-RS returns it")
# Frames carry the stored values, whatever the representation: signed CT (two's complement,
# with a rescale) and MONOCHROME1 (bright is low) read back exactly as stored.
for name, signed, photometric in (("signed", 1, "MONOCHROME2"), ("MONOCHROME1", 0, "MONOCHROME1")):
    ds = ct_slice(7)
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PixelRepresentation, ds.PhotometricInterpretation = signed, photometric
    ds.RescaleIntercept, ds.RescaleSlope = (0, 1) if signed else (-1024, 1)
    values = np.arange(96).reshape(8, 12) * 41
    values = values - 2048 if signed else values % 4096
    ds.PixelData = values.astype("<i2" if signed else "<u2").tobytes()
    check(len(client.store_instances([ds]).get("ReferencedSOPSequence", [])) == 1, f"STOW-RS of a {name} instance")
    got = client.retrieve_instance_frames(ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID, frame_numbers=[1])
    check(got[0] == ds.PixelData, f"… WADO-RS frame 1 holds its stored values")
# A study of nothing but a structured report (no pixels at all) is a study all the same: found
# by its patient and modality, with its instance counted.
sr = Dataset()
sr.file_meta = FileMetaDataset()
sr.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
sr.file_meta.MediaStorageSOPClassUID = sr.SOPClassUID = "1.2.840.10008.5.1.4.1.1.88.11"  # Basic Text SR
sr.SOPInstanceUID = sr.file_meta.MediaStorageSOPInstanceUID = generate_uid()
sr.StudyInstanceUID, sr.SeriesInstanceUID = generate_uid(), generate_uid()
sr.PatientName, sr.PatientID, sr.StudyDate, sr.Modality = "Report^Only", "DWC-SR-01", "20251125", "SR"
sr.StudyDescription = "REPORT ONLY"
check(len(client.store_instances([sr]).get("ReferencedSOPSequence", [])) == 1, "STOW-RS of a structured report")
found = client.search_for_studies(search_filters={"PatientID": "DWC-SR-01"})
check(len(found) == 1, "QIDO-RS finds a study made only of a report, by PatientID")
report_study = Dataset.from_json(found[0])
check(report_study.StudyInstanceUID == sr.StudyInstanceUID and report_study.NumberOfStudyRelatedInstances == 1,
      "… with its one instance counted")
check(str(report_study.PatientName) == "Report^Only" and report_study.StudyDescription == "REPORT ONLY",
      "… and the report's patient and description")
check(len(client.search_for_studies(search_filters={"ModalitiesInStudy": "SR", "PatientID": "DWC-SR-01"})) == 1,
      "… and by its modality")
check(len(client.search_for_studies(search_filters={"PatientName": "report*"})) == 1, "… and by the patient's name")
check(len(client.search_for_series(sr.StudyInstanceUID)) == 1, "QIDO-RS lists the report's series")

# Paging: more matches than the page holds are announced (PS3.18's Warning), and only then.
r = requests.get(f"{BASE}/studies", params={"PatientID": "DWC-0001", "limit": "1"})
check(r.status_code == 200 and len(r.json()) == 1 and "additional results" in r.headers.get("Warning", ""),
      "a page smaller than the matches says there are more")
r = requests.get(f"{BASE}/studies", params={"PatientID": "DWC-0001", "limit": "100"})
check(r.status_code == 200 and len(r.json()) > 1 and "Warning" not in r.headers, "… and a page that holds them all does not")
r2 = requests.get(f"{BASE}/studies", params={"PatientID": "DWC-0001", "limit": "1", "offset": "1"})
check(r2.json()[0] == r.json()[1], "offset pages through the same order")

# Search answers are JSON only: a client that takes only XML is told so.
r = requests.get(f"{BASE}/studies", headers={"Accept": "multipart/related; type=\"application/dicom+xml\""})
check(r.status_code == 406, f"QIDO-RS asked for XML only: 406 ({r.status_code})")
r = requests.get(f"{BASE}/studies/{STUDY}/metadata", headers={"Accept": "application/dicom+xml"})
check(r.status_code == 406, f"WADO-RS metadata asked for XML only: 406 ({r.status_code})")
r = requests.get(f"{BASE}/studies", params={"PatientID": "DWC-SR-01"}, headers={"Accept": "application/dicom+json"})
check(r.status_code == 200 and len(r.json()) == 1, "… and for application/dicom+json: answered")
print("dicomweb-client: all checks passed")
