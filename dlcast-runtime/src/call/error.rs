//! The refusals of a call, which live with every other refusal in
//! [`crate::error`]; re-exported here for the call's modules.

pub(crate) use crate::error::{CallError, ImportRefusal, WhyNot};
