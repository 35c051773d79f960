//! Structured reports (SR, PS3.3 C.17.3) as plain text, for a reader of the report: the
//! document's title, patient, completion and verification, then its content tree one item
//! per line (concept name: value), indented by depth. Not a full SR renderer: no templates,
//! no references by position, images and coordinates named by their concept only.

use dicom_core::Tag;
use dicom_dictionary_std::tags;
use dicom_object::InMemDicomObject;

use super::text;

/// Most levels of nested content written out; deeper items are summarised in one line.
const MAX_DEPTH: usize = 16;
/// Most bytes of text written (a hostile report may hold millions of items).
const MAX_TEXT: usize = 1 << 20;

/// The report in `obj` as text.
pub(crate) fn render(obj: &InMemDicomObject) -> String {
    let mut out = concept(obj).unwrap_or_else(|| "Structured report".into());
    out.push('\n');
    for (label, tag) in [
        ("Patient", tags::PATIENT_NAME),
        ("Patient ID", tags::PATIENT_ID),
        ("Study date", tags::STUDY_DATE),
        ("Accession", tags::ACCESSION_NUMBER),
        ("Completion", tags::COMPLETION_FLAG),
        ("Verification", tags::VERIFICATION_FLAG),
    ] {
        if let Some(v) = text(obj, tag) {
            out.push_str(&format!("{label}: {v}\n"));
        }
    }
    out.push('\n');
    content(obj, 0, &mut out);
    out
}

/// The items of `obj`'s Content Sequence, and theirs, at `depth`.
fn content(obj: &InMemDicomObject, depth: usize, out: &mut String) {
    let Some(items) = obj.get(tags::CONTENT_SEQUENCE).and_then(|e| e.items()) else { return };
    let indent = "  ".repeat(depth);
    if depth >= MAX_DEPTH {
        out.push_str(&format!("{indent}… {} items nested deeper\n", items.len()));
        return;
    }
    for item in items {
        if out.len() > MAX_TEXT {
            out.push_str("… (the rest of the report is not shown)\n");
            return;
        }
        let line = match (concept(item), value(item)) {
            (Some(name), Some(v)) => format!("{name}: {v}"),
            (Some(name), None) => name,
            (None, Some(v)) => v,
            (None, None) => text(item, tags::VALUE_TYPE).unwrap_or_else(|| "(item)".into()),
        };
        out.push_str(&indent);
        out.push_str(&line);
        out.push('\n');
        content(item, depth + 1, out);
    }
}

/// The meaning (else the value) of the first code of sequence `seq` in `obj`.
fn code(obj: &InMemDicomObject, seq: Tag, prefer_value: bool) -> Option<String> {
    let item = obj.get(seq)?.items()?.first()?;
    let (a, b) = if prefer_value {
        (tags::CODE_VALUE, tags::CODE_MEANING)
    } else {
        (tags::CODE_MEANING, tags::CODE_VALUE)
    };
    text(item, a).or_else(|| text(item, b))
}

fn concept(obj: &InMemDicomObject) -> Option<String> {
    code(obj, tags::CONCEPT_NAME_CODE_SEQUENCE, false)
}

/// An item's value, by its Value Type; none for containers, images and coordinates.
fn value(obj: &InMemDicomObject) -> Option<String> {
    match text(obj, tags::VALUE_TYPE)?.as_str() {
        "TEXT" => text(obj, tags::TEXT_VALUE),
        "CODE" => code(obj, tags::CONCEPT_CODE_SEQUENCE, false),
        "NUM" => {
            let m = obj.get(tags::MEASURED_VALUE_SEQUENCE)?.items()?.first()?;
            let v = text(m, tags::NUMERIC_VALUE)?;
            // Units by their code (UCUM: "mm", "cm3"), shorter than their meaning.
            Some(match code(m, tags::MEASUREMENT_UNITS_CODE_SEQUENCE, true) {
                Some(unit) => format!("{v} {unit}"),
                None => v,
            })
        }
        "DATETIME" => text(obj, tags::DATE_TIME),
        "DATE" => text(obj, tags::DATE),
        "TIME" => text(obj, tags::TIME),
        "PNAME" => text(obj, tags::PERSON_NAME),
        "UIDREF" => text(obj, tags::UID),
        _ => None,
    }
}
