//! Fuzzing staleguard (`cargo fuzz`, see `RELIABILITY.md` and `run.sh`): the properties each
//! target checks live in [`props`], shared with `tests/fuzz_smoke.rs`; [`seeds`] makes the
//! starting corpora from real driver messages.

#[path = "../../../benches/common/msgs.rs"]
pub mod msgs;
pub mod props;
pub mod seeds;
