//! The built-in filters. Each module documents the exact definition it implements.

use std::sync::Arc;

use crate::filter::Filter;

pub(crate) mod common;
pub(crate) mod sums;
// The eight filters of MedJava / xv.
pub mod blur;
pub mod despeckle;
pub mod edge;
pub mod emboss;
pub mod oilpaint;
pub mod pixelize;
pub mod sharpen;
pub mod spread;
// What a radiologist uses every day.
pub mod convolve;
pub mod invert;
pub mod orient;
pub mod unsharp;
pub mod window;
pub mod zoom;

/// Every built-in filter.
pub fn builtins() -> Vec<Arc<dyn Filter>> {
    let mut v: Vec<Arc<dyn Filter>> = Vec::new();
    for register in [
        blur::register,
        despeckle::register,
        edge::register,
        emboss::register,
        oilpaint::register,
        pixelize::register,
        sharpen::register,
        spread::register,
        convolve::register,
        invert::register,
        orient::register,
        unsharp::register,
        window::register,
        zoom::register,
    ] {
        register(&mut v);
    }
    v
}
