//! Holds no code: see `tests/ui.rs` and the cases in `tests/ui/`.
