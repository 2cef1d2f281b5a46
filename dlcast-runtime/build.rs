//! Makes PyO3's interpreter cfgs (`Py_LIMITED_API`, `Py_3_12`, ...)
//! available to this crate, so that abi3 builds avoid what the limited API
//! hides (the fields of type objects).

fn main() {
    pyo3_build_config::print_expected_cfgs();
    pyo3_build_config::use_pyo3_cfgs();
}
