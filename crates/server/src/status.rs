//! The edge mappings: store errors to gRPC status codes (control plane) and to data-plane
//! error codes. Explicit, so a client can act on the code without parsing messages.

use bs_store::StoreError;
use bs_wire::ErrorCode;
use tonic::{Code, Status};

/// gRPC status for a store error.
pub fn store_status(e: &StoreError) -> Status {
    let code = match e {
        StoreError::NotFound(_) | StoreError::NoUpload(_) => Code::NotFound,
        StoreError::AlreadyExists(_) => Code::AlreadyExists,
        StoreError::InvalidName { .. }
        | StoreError::InvalidMetadata(_)
        | StoreError::Gap { .. }
        | StoreError::BeyondSize { .. }
        | StoreError::OutOfRange { .. } => Code::InvalidArgument,
        StoreError::Incomplete { .. }
        | StoreError::Unsupported(_)
        | StoreError::ConditionFailed(_) => Code::FailedPrecondition,
        StoreError::Busy(_) => Code::Aborted,
        StoreError::StorageFull(_) => Code::ResourceExhausted,
        StoreError::Corrupt { .. } => Code::DataLoss,
        StoreError::Unavailable(_) => Code::Unavailable,
        StoreError::Io(_)
        | StoreError::IoAt { .. }
        | StoreError::Meta(_)
        | StoreError::Config(_) => Code::Internal,
    };
    Status::new(code, e.client_message())
}

/// Data-plane error code for a store error.
pub fn store_code(e: &StoreError) -> ErrorCode {
    match e {
        StoreError::NotFound(_) | StoreError::NoUpload(_) => ErrorCode::NotFound,
        StoreError::Gap { .. } | StoreError::BeyondSize { .. } | StoreError::OutOfRange { .. } => {
            ErrorCode::OutOfRange
        }
        StoreError::Incomplete { .. } => ErrorCode::Incomplete,
        StoreError::Busy(_) => ErrorCode::Busy,
        StoreError::StorageFull(_) => ErrorCode::StorageFull,
        StoreError::Corrupt { .. } => ErrorCode::Corrupt,
        StoreError::Unsupported(_) => ErrorCode::BadFrame,
        _ => ErrorCode::Internal,
    }
}
