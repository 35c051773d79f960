//! Sample images put into an empty store on first start, so a new user sees something at
//! once: a CT head phantom (DICOM, signed 16-bit, in Hounsfield units), a series of 16 thinner
//! slices through the same phantom (a study of two series for the worklist and the series
//! viewer), a photo-like colour test card (PNG, RGB 8-bit) and a chest-radiograph-like 16-bit
//! greyscale image (PNG). All are generated here, deterministically; nothing is downloaded.

use bs_imaging::{DynImage, Image};
use dicom_core::value::PrimitiveValue;
use dicom_core::{DataElement, Tag, VR};
use dicom_dictionary_std::tags;
use dicom_object::mem::InMemElement;
use dicom_object::{FileMetaTableBuilder, InMemDicomObject};

/// Name, media type and bytes of each sample.
pub fn all() -> Vec<(String, &'static str, Vec<u8>)> {
    let png = |img: DynImage| bs_imageio::encode(&img, bs_imageio::Format::Png).unwrap_or_default();
    let mut v = vec![
        ("samples/ct-phantom.dcm".to_string(), "application/dicom", ct_phantom_dicom(512)),
        ("samples/test-card.png".into(), "image/png", png(DynImage::U8(test_card(1024, 768)))),
        ("samples/xray-16bit.png".into(), "image/png", png(DynImage::U16(xray(1024)))),
    ];
    for i in 0..SERIES_SLICES {
        let name = format!("samples/ct-series/slice-{:02}.dcm", i + 1);
        v.push((name, "application/dicom", ct_series_slice(i)));
    }
    v
}

/// Slices in the sample series, 5 mm apart.
pub const SERIES_SLICES: u16 = 16;

const STUDY_UID: &str = "2.25.302227208390563154781239004861377"; // "2.25." + UID_DIGITS

/// Deterministic noise in -1..1 (a 32-bit LCG; statistical quality does not matter here).
struct Noise(u32);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        f64::from(self.0 >> 8) / f64::from(1u32 << 23) - 1.0
    }
}

/// Hounsfield units of the modified Shepp–Logan head phantom at (x, y) in -1..1, with each
/// ellipse setting (not adding) its tissue's value: air, skull, brain, ventricles, lesions.
fn shepp_logan_hu(x: f64, y: f64) -> f64 {
    // (centre x, centre y, semi-axis a, semi-axis b, rotation in degrees, HU)
    const E: [(f64, f64, f64, f64, f64, f64); 10] = [
        (0.0, 0.0, 0.69, 0.92, 0.0, 1200.0),
        (0.0, -0.0184, 0.6624, 0.874, 0.0, 35.0),
        (0.22, 0.0, 0.11, 0.31, -18.0, 8.0),
        (-0.22, 0.0, 0.16, 0.41, 18.0, 8.0),
        (0.0, 0.35, 0.21, 0.25, 0.0, 55.0),
        (0.0, 0.1, 0.046, 0.046, 0.0, 70.0),
        (0.0, -0.1, 0.046, 0.046, 0.0, 70.0),
        (-0.08, -0.605, 0.046, 0.023, 0.0, 90.0),
        (0.0, -0.606, 0.023, 0.023, 0.0, 90.0),
        (0.06, -0.605, 0.023, 0.046, 0.0, 90.0),
    ];
    let mut v = -1000.0;
    for (cx, cy, a, b, deg, hu) in E {
        let (s, c) = deg.to_radians().sin_cos();
        let (dx, dy) = (x - cx, y - cy);
        let (u, w) = (dx * c + dy * s, -dx * s + dy * c);
        if (u / a).powi(2) + (w / b).powi(2) <= 1.0 {
            v = hu;
        }
    }
    v
}

/// The CT phantom as a DICOM Part 10 file (explicit VR little endian).
pub fn ct_phantom_dicom(n: u16) -> Vec<u8> {
    let slice = Slice { z: 0.0, series: 2, instance: 1, description: "AXIAL MODIFIED SHEPP-LOGAN" };
    ct_dicom(n, &slice)
}

/// Slice `i` (from 0) of the sample series: 128 × 128, from z = −0.75 to 0.75 of the head.
pub fn ct_series_slice(i: u16) -> Vec<u8> {
    ct_slice_of(128, i, SERIES_SLICES)
}

/// Slice `i` of `count` through the phantom, `size` × `size` pixels (all slices of one series;
/// benchmarks make series of realistic size with it).
pub fn ct_slice_of(size: u16, i: u16, count: u16) -> Vec<u8> {
    let z = -0.75 + 1.5 * f64::from(i) / f64::from(count.max(2) - 1);
    ct_dicom(size, &Slice { z, series: 4, instance: i + 1, description: "AXIAL 16 x 5 mm" })
}

/// The digits of every UID in the samples after "2.25." (33 of them): a benchmark that needs
/// new UIDs replaces them with others of the same length.
pub const UID_DIGITS: &str = "302227208390563154781239004861377";

/// Where a slice is: height through the head (−1..1), series (UID suffix) and instance.
struct Slice {
    z: f64,
    series: u32,
    instance: u16,
    description: &'static str,
}

fn ct_dicom(n: u16, slice: &Slice) -> Vec<u8> {
    let mut noise = Noise(7 + u32::from(slice.instance) * 31 + slice.series);
    let size = f64::from(n);
    // The 2-D phantom is the section of an ellipsoidal head: smaller towards the top and base.
    let shrink = (1.0 - slice.z * slice.z).sqrt().max(0.05);
    let mut px = Vec::with_capacity(usize::from(n) * usize::from(n));
    for j in 0..n {
        for i in 0..n {
            let x = (f64::from(i) + 0.5) / size * 2.0 - 1.0;
            let y = 1.0 - (f64::from(j) + 0.5) / size * 2.0;
            let hu = shepp_logan_hu(x / shrink, y / shrink);
            let hu = if hu > -1000.0 { hu + 6.0 * noise.next() } else { hu };
            px.push(hu.round() as i16);
        }
    }
    let uid = STUDY_UID;
    let series_uid = format!("{uid}.{}", slice.series);
    let sop_uid = format!("{uid}.{}.{}", slice.series, slice.instance);
    let z_mm = format!("{:.1}", slice.z * 40.0);
    let position = format!("-125\\-125\\{z_mm}");
    let obj = [
        el(tags::SOP_CLASS_UID, VR::UI, "1.2.840.10008.5.1.4.1.1.2"),
        el(tags::SOP_INSTANCE_UID, VR::UI, &sop_uid),
        el(tags::STUDY_DATE, VR::DA, "20260101"),
        el(tags::MODALITY, VR::CS, "CT"),
        el(tags::STUDY_DESCRIPTION, VR::LO, "SYNTHETIC HEAD PHANTOM"),
        el(tags::SERIES_DESCRIPTION, VR::LO, slice.description),
        el(tags::PATIENT_NAME, VR::PN, "PHANTOM^CT"),
        el(tags::PATIENT_ID, VR::LO, "BS-0001"),
        el(tags::STUDY_INSTANCE_UID, VR::UI, &format!("{uid}.1")),
        el(tags::SERIES_INSTANCE_UID, VR::UI, &series_uid),
        el(tags::SERIES_NUMBER, VR::IS, if slice.series == 2 { "1" } else { "2" }),
        el(tags::ACCESSION_NUMBER, VR::SH, "ACC-0001"),
        el(tags::BODY_PART_EXAMINED, VR::CS, "HEAD"),
        el(tags::INSTANCE_NUMBER, VR::IS, &slice.instance.to_string()),
        el(tags::SLICE_LOCATION, VR::DS, &z_mm),
        el(tags::IMAGE_POSITION_PATIENT, VR::DS, &position),
        el(tags::IMAGE_ORIENTATION_PATIENT, VR::DS, "1\\0\\0\\0\\1\\0"),
        el(tags::WINDOW_CENTER, VR::DS, "40"),
        el(tags::WINDOW_WIDTH, VR::DS, "400"),
        el(tags::RESCALE_INTERCEPT, VR::DS, "0"),
        el(tags::RESCALE_SLOPE, VR::DS, "1"),
        DataElement::new(tags::PIXEL_DATA, VR::OW, PrimitiveValue::I16(px.into())),
    ]
    .into_iter()
    .chain(grey_pixels(n, 16, true));
    part10(InMemDicomObject::from_element_iter(obj), "1.2.840.10008.5.1.4.1.1.2", &sop_uid)
}

/// The elements that describe `n` × `n` grey pixels of `bits` bits, signed or not, all of
/// them stored.
pub(crate) fn grey_pixels(n: u16, bits: u16, signed: bool) -> [InMemElement; 8] {
    [
        us(tags::SAMPLES_PER_PIXEL, 1),
        el(tags::PHOTOMETRIC_INTERPRETATION, VR::CS, "MONOCHROME2"),
        us(tags::ROWS, n),
        us(tags::COLUMNS, n),
        us(tags::BITS_ALLOCATED, bits),
        us(tags::BITS_STORED, bits),
        us(tags::HIGH_BIT, bits - 1),
        us(tags::PIXEL_REPRESENTATION, u16::from(signed)),
    ]
}

/// A DICOM element holding text.
pub(crate) fn el(tag: Tag, vr: VR, v: &str) -> InMemElement {
    DataElement::new(tag, vr, PrimitiveValue::from(v))
}

/// A DICOM element holding one unsigned short.
pub(crate) fn us(tag: Tag, v: u16) -> InMemElement {
    DataElement::new(tag, VR::US, PrimitiveValue::from(v))
}

/// `obj` as a DICOM Part 10 file (explicit VR little endian) of SOP class `class`, instance
/// `uid`; empty if it cannot be written.
pub(crate) fn part10(obj: InMemDicomObject, class: &str, uid: &str) -> Vec<u8> {
    let file = obj.with_meta(
        FileMetaTableBuilder::new()
            .transfer_syntax("1.2.840.10008.1.2.1")
            .media_storage_sop_class_uid(class)
            .media_storage_sop_instance_uid(uid),
    );
    let mut out = Vec::new();
    match file {
        Ok(f) if f.write_all(&mut out).is_ok() => out,
        _ => Vec::new(),
    }
}

/// A colour test card: smooth hue/brightness field, colour bars, grey steps, a fine
/// resolution wedge and circles — things that show what each filter does.
pub fn test_card(w: usize, h: usize) -> Image<u8> {
    let mut img = Image::<u8>::new(w, h, 3);
    let bars: [[u8; 3]; 8] = [
        [235, 235, 235],
        [235, 235, 16],
        [16, 235, 235],
        [16, 235, 16],
        [235, 16, 235],
        [235, 16, 16],
        [16, 16, 235],
        [16, 16, 16],
    ];
    let (cx, cy) = (w as f64 / 2.0, h as f64 / 2.0);
    let r = h as f64 * 0.42;
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (x as f64 / w as f64, y as f64 / h as f64);
            // Background: a smooth hue sweep, darker towards the bottom.
            let hue = fx * 6.0;
            let base = |o: f64| {
                let t = ((hue + o) % 6.0 - 3.0).abs() - 1.0;
                (t.clamp(0.0, 1.0) * (0.35 + 0.5 * (1.0 - fy)) * 255.0) as u8
            };
            let mut px = [base(0.0), base(2.0), base(4.0)];
            let (dx, dy) = (x as f64 - cx, y as f64 - cy);
            let d = (dx * dx + dy * dy).sqrt();
            if d < r {
                let band = ((fy - 0.08) / 0.84 * 5.0).floor() as i64;
                px = match band {
                    0 | 1 => bars[((fx - 0.5) / 0.84 * 8.0 + 4.0).clamp(0.0, 7.0) as usize],
                    2 => {
                        let g = (((fx - 0.08) / 0.84) * 10.0).floor().clamp(0.0, 9.0) * 28.0;
                        [g as u8; 3]
                    }
                    3 => {
                        // Frequency wedge: stripes getting finer to the right.
                        let f = 2.0 + 60.0 * fx;
                        let v = if (fx * f * 6.0).sin() > 0.0 { 230 } else { 25 };
                        [v; 3]
                    }
                    _ => {
                        let skin = [224.0, 172.0, 105.0];
                        let shade = 0.6 + 0.4 * (1.0 - d / r);
                        skin.map(|c: f64| (c * shade) as u8)
                    }
                };
            }
            if (d - r).abs() < 2.0 || ((d - r * 0.5).abs() < 1.0) {
                px = [250, 250, 250];
            }
            if x % 64 == 0 || y % 64 == 0 {
                px = px.map(|c| c / 2 + 100);
            }
            let o = (y * w + x) * 3;
            img.data[o..o + 3].copy_from_slice(&px);
        }
    }
    img
}

/// A chest-radiograph-like 16-bit image: soft tissue, two lungs, a spine and ribs, with
/// quantum-like noise, spanning roughly 12 bits in 16-bit samples.
pub fn xray(n: usize) -> Image<u16> {
    let mut img = Image::<u16>::new(n, n, 1);
    let mut noise = Noise(11);
    for y in 0..n {
        for x in 0..n {
            let u = x as f64 / n as f64 * 2.0 - 1.0;
            let v = y as f64 / n as f64 * 2.0 - 1.0;
            let body = 1.0 - (u / 0.85).powi(2) - (v / 1.1).powi(2);
            let mut a = if body > 0.0 { 1400.0 + 900.0 * body.sqrt() } else { 300.0 };
            for side in [-1.0, 1.0] {
                let l = 1.0 - ((u - side * 0.36) / 0.27).powi(2) - ((v + 0.05) / 0.6).powi(2);
                if l > 0.0 {
                    a -= 900.0 * l.sqrt();
                    // Ribs: bright arcs across each lung.
                    let rib = ((v + 0.3 * (u - side * 0.36).powi(2)) * 14.0).sin();
                    if rib > 0.75 {
                        a += 450.0;
                    }
                }
            }
            if u.abs() < 0.06 && body > 0.0 {
                a += 1500.0 * (1.0 - u.abs() / 0.06);
            }
            let heart = 1.0 - ((u + 0.12) / 0.25).powi(2) - ((v - 0.25) / 0.3).powi(2);
            if heart > 0.0 {
                a += 700.0 * heart.sqrt();
            }
            a += 25.0 * noise.next();
            img.data[y * n + x] = (a.clamp(0.0, 4095.0) * 16.0) as u16;
        }
    }
    img
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_decode_with_the_promised_metadata() {
        let lim = bs_imageio::Limits::default();
        let s = all();
        assert_eq!(s.len(), 3 + usize::from(SERIES_SLICES));
        let ct = bs_imageio::decode(&s[0].2, Some(s[0].0.as_str()), &lim).unwrap();
        assert_eq!((ct.meta.width, ct.meta.height), (512, 512));
        assert_eq!(ct.meta.modality.as_deref(), Some("CT"));
        assert_eq!(ct.meta.patient_name.as_deref(), Some("PHANTOM^CT"));
        assert_eq!(ct.meta.window_center, Some(40.0));
        assert_eq!(ct.meta.window_width, Some(400.0));
        // The centre of the phantom is brain tissue (about 35 HU), the corner air.
        let DynImage::U16(i) = &ct.image else { panic!("16-bit") };
        let centre = ct.meta.modality_value(u32::from(i.get(256, 300, 0))).unwrap();
        let corner = ct.meta.modality_value(u32::from(i.get(2, 2, 0))).unwrap();
        assert!((20.0..=50.0).contains(&centre), "{centre}");
        assert_eq!(corner, -1000.0);
        let card = bs_imageio::decode(&s[1].2, Some(s[1].0.as_str()), &lim).unwrap();
        assert_eq!(
            (card.meta.width, card.meta.height, card.meta.pixel_kind.as_str()),
            (1024, 768, "rgb8")
        );
        let xr = bs_imageio::decode(&s[2].2, Some(s[2].0.as_str()), &lim).unwrap();
        assert_eq!(xr.meta.pixel_kind, "gray16");
        // The series: one study with the phantom, slices 5 mm apart, smaller towards the ends.
        let slices: Vec<_> = s[3..]
            .iter()
            .map(|(name, _, bytes)| bs_imageio::decode(bytes, Some(name.as_str()), &lim).unwrap())
            .collect();
        let (first, mid) = (&slices[0].meta, &slices[7].meta);
        assert_eq!(first.study_instance_uid, ct.meta.study_instance_uid);
        assert_ne!(first.series_instance_uid, ct.meta.series_instance_uid);
        assert_eq!((first.instance_number, mid.instance_number), (Some(1), Some(8)));
        let z = |m: &bs_imageio::ImageMeta| m.image_position_patient.unwrap()[2];
        assert_eq!((z(first), z(mid)), (-30.0, -2.0));
        let tissue = |d: &bs_imageio::Decoded| {
            let DynImage::U16(i) = &d.image else { panic!("16-bit") };
            i.data
                .iter()
                .filter(|&&p| d.meta.modality_value(u32::from(p)).unwrap() > -900.0)
                .count()
        };
        assert!(tissue(&slices[0]) < tissue(&slices[7]));
    }
}
