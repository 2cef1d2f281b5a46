// An `ArrayHandle` takes `#[shape]`, `#[device]` and `#[order]`; its element
// type fixes the dtype and its borrows never convert.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyclass]
struct Layer {
    weights: ArrayHandle<f32>,
}

#[dlcast::pymethods]
impl Layer {
    #[new]
    fn new(#[dtype(f32)] #[noconvert] weights: ArrayHandle<f32>) -> Self {
        Layer { weights }
    }
}

fn main() {}
