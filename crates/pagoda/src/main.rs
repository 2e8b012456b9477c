//! The pagoda command line.
fn main() {}
