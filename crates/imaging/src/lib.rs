//! Image processing for blobstream, with no network code: pixel buffers of 8- and 16-bit
//! grayscale and RGB(A) ([`Image`], [`DynImage`]), the eight filters MedJava measured against
//! xv plus what a radiologist uses every day, chains of them, and a [`Registry`] that loads
//! further definitions from a directory and can reload them while a program runs.

pub mod error;
pub mod filter;
pub mod filters;
pub mod image;
pub mod params;
pub mod registry;

pub use error::ImagingError;
pub use filter::{Filter, FilterInfo, Output, ParamInfo, Run};
pub use image::{DynImage, Image, PixelKind, Sample};
pub use params::Params;
pub use registry::Registry;
