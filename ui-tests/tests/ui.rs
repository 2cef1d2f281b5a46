//! Compile-fail and pass cases for `#[dlpack_fn]`. Regenerate the `.stderr`
//! snapshots with `TRYBUILD=overwrite cargo test -p dlcast-ui-tests`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
