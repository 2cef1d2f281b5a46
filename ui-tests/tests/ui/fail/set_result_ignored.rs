//! A write whose failure is ignored does not compile under
//! `#[deny(unused_must_use)]` (a warning by default).
#![deny(unused_must_use)]

use dlcast_runtime::prelude::*;

fn body(out: &mut TensorMut<'_, f32, 2>, dynamic: &mut TensorMut<'_, f32>) {
    out.set([0, 0], 1.0);
    dynamic.set(&[0, 0], 1.0);
}

fn main() {}
