//! DICOM JSON (PS3.18 F.2): attributes keyed by 8-hex-digit tag, each `{"vr": .., "Value": [..]}`
//! (Person Name values as `{"Alphabetic": ..}`), built from the index's metadata.

use serde_json::{Map, Value, json};

/// A DICOM JSON object under construction.
#[derive(Default)]
pub(crate) struct Object(Map<String, Value>);

impl Object {
    /// Add `tag` with VR `vr` and one value, unless the value is empty (integers as JSON
    /// numbers, F.2.3.1).
    pub fn text(mut self, tag: &str, vr: &str, value: &str) -> Self {
        if !value.is_empty() {
            let number = matches!(vr, "IS" | "US" | "UL" | "SS" | "SL");
            let v = match value.trim().parse::<i64>() {
                Ok(n) if number => json!(n),
                _ if vr == "PN" => json!({ "Alphabetic": value }),
                _ => json!(value),
            };
            self.0.insert(tag.into(), json!({ "vr": vr, "Value": [v] }));
        }
        self
    }

    /// Add `tag` with several string values (e.g. ModalitiesInStudy), unless there are none.
    pub fn texts(mut self, tag: &str, vr: &str, values: &[String]) -> Self {
        if !values.is_empty() {
            self.0.insert(tag.into(), json!({ "vr": vr, "Value": values }));
        }
        self
    }

    /// Add an integer attribute (IS, US, UL).
    pub fn int(mut self, tag: &str, vr: &str, value: Option<i64>) -> Self {
        if let Some(v) = value {
            self.0.insert(tag.into(), json!({ "vr": vr, "Value": [v] }));
        }
        self
    }

    /// Add a decimal attribute (DS) of one or more values.
    pub fn decimals(mut self, tag: &str, values: &[f64]) -> Self {
        if !values.is_empty() {
            self.0.insert(tag.into(), json!({ "vr": "DS", "Value": values }));
        }
        self
    }

    /// Add a sequence of items.
    pub fn sequence(mut self, tag: &str, items: Vec<Value>) -> Self {
        self.0.insert(tag.into(), json!({ "vr": "SQ", "Value": items }));
        self
    }

    /// Copy the string fields of the index metadata `meta` named in `fields` as
    /// `(tag, vr, field)`.
    pub fn with_meta(mut self, meta: &Value, fields: &[(&str, &str, &str)]) -> Self {
        for (tag, vr, field) in fields {
            let v = match meta.get(*field) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => continue,
            };
            self = self.text(tag, vr, &v);
        }
        self
    }

    /// The patient, study, series and instance attributes of an instance's index metadata:
    /// what every instance-level answer (QIDO-RS, WADO-RS metadata) starts from.
    pub fn instance(meta: &Value) -> Self {
        Self::default()
            .with_meta(meta, STUDY_FIELDS)
            .with_meta(meta, SERIES_FIELDS)
            .with_meta(meta, INSTANCE_FIELDS)
    }

    pub fn build(self) -> Value {
        Value::Object(self.0)
    }
}

/// Patient and study attributes every level of a search answer carries.
pub(crate) const STUDY_FIELDS: &[(&str, &str, &str)] = &[
    ("00080020", "DA", "study_date"),
    ("00080030", "TM", "study_time"),
    ("00080050", "SH", "accession_number"),
    ("00081030", "LO", "study_description"),
    ("00100010", "PN", "patient_name"),
    ("00100020", "LO", "patient_id"),
    ("00100030", "DA", "patient_birth_date"),
    ("00100040", "CS", "patient_sex"),
    ("0020000D", "UI", "study_instance_uid"),
    ("00200010", "SH", "study_id"),
];

/// Series attributes.
pub(crate) const SERIES_FIELDS: &[(&str, &str, &str)] = &[
    ("00080060", "CS", "modality"),
    ("0008103E", "LO", "series_description"),
    ("0020000E", "UI", "series_instance_uid"),
    ("00200011", "IS", "series_number"),
    ("00180015", "CS", "body_part_examined"),
];

/// Instance attributes.
pub(crate) const INSTANCE_FIELDS: &[(&str, &str, &str)] = &[
    ("00080016", "UI", "sop_class_uid"),
    ("00080018", "UI", "sop_instance_uid"),
    ("00200013", "IS", "instance_number"),
    ("00280008", "IS", "number_of_frames"),
    ("00280010", "US", "height"),
    ("00280011", "US", "width"),
    ("00280004", "CS", "photometric_interpretation"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_in_dicom_json_form() {
        let meta =
            json!({ "patient_name": "Doe^Jane", "study_date": "20240131", "instance_number": 7 });
        let o = Object::default()
            .with_meta(&meta, STUDY_FIELDS)
            .with_meta(&meta, INSTANCE_FIELDS)
            .texts("00080061", "CS", &["CT".into(), "MR".into()])
            .int("00201208", "IS", Some(3))
            .text("00081030", "LO", "")
            .build();
        assert_eq!(o["00100010"], json!({ "vr": "PN", "Value": [{ "Alphabetic": "Doe^Jane" }] }));
        assert_eq!(o["00080020"], json!({ "vr": "DA", "Value": ["20240131"] }));
        assert_eq!(o["00200013"], json!({ "vr": "IS", "Value": [7] }));
        assert_eq!(o["00080061"]["Value"], json!(["CT", "MR"]));
        assert_eq!(o["00201208"]["Value"], json!([3]));
        assert!(o.get("00081030").is_none(), "empty values are left out");
    }
}
