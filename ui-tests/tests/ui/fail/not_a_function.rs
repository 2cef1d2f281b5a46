use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
struct S;

fn main() {}
