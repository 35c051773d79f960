//! Parameter parsing under fire: any key and any text value, for every built-in filter, on
//! every pixel kind, gives a result or a clear error — never a panic.

use bs_imaging::{DynImage, Image, ImagingError, Params, Registry, Run};
use proptest::prelude::*;

fn images() -> Vec<DynImage> {
    let mut v = Vec::new();
    for ch in [1, 3, 4] {
        let mut a = Image::<u8>::new(5, 4, ch);
        let mut b = Image::<u16>::new(5, 4, ch);
        for (i, s) in a.data.iter_mut().enumerate() {
            *s = (i * 37 % 256) as u8;
        }
        for (i, s) in b.data.iter_mut().enumerate() {
            *s = (i * 9973 % 65536) as u16;
        }
        v.push(DynImage::U8(a));
        v.push(DynImage::U16(b));
    }
    v
}

/// Values that probe parsers: numbers at and beyond every edge, and junk.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<f64>().prop_map(|f| f.to_string()),
        any::<i64>().prop_map(|i| i.to_string()),
        (-40i32..40).prop_map(|i| i.to_string()),
        Just("NaN".to_string()),
        Just("-inf".to_string()),
        Just("".to_string()),
        Just("1e400".to_string()),
        Just("0,1,0; 1,-4,1; 0,1,0".to_string()),
        Just("1,2; 3".to_string()),
        "\\PC{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn any_parameters_give_a_result_or_an_error(pick in 0usize..1000, which in 0usize..1000, v in value(), img in 0usize..6) {
        let reg = Registry::builtin();
        let list = reg.list();
        let f = &list[pick % list.len()];
        // Mostly the filter's own parameter names (so values reach the parsers), sometimes not.
        let key = if f.params.is_empty() || which % 5 == 0 {
            "bogus".to_string()
        } else {
            f.params[which % f.params.len()].name.clone()
        };
        let params = Params::new().with(&key, &v);
        let img = &images()[img];
        match reg.apply(&f.name, img, &params, &Run::with_threads(1 + which % 2)) {
            Ok(out) => prop_assert!(out.width() > 0 && out.height() > 0),
            Err(ImagingError::BadParam { .. } | ImagingError::UnknownParam { .. }
                | ImagingError::Unsupported { .. } | ImagingError::TooLarge { .. }) => {}
            Err(e) => prop_assert!(false, "{}: unexpected error {e}", f.name),
        }
    }
}
