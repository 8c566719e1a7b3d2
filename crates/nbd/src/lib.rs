//! placeholder: see the crate description
