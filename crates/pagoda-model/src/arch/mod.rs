//! Architectures, one file each.
