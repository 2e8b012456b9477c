//! The one error type of the kernel crate.

/// Errors raised at the device boundary.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T, E = KernelError> = std::result::Result<T, E>;
