//! Parse counters (cargo feature `parse-counters`, for tests): how many message headers this
//! thread has read and how many bodies it has decompressed. They let a test show that a
//! message is opened once. Without the feature the hooks are empty and compile to nothing.

/// What this thread has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Calls of [`crate::Header::parse`] (every header read goes through it).
    pub header_parses: u64,
    /// Decompressions begun: calls of [`crate::compressed::Compressed::decompress`] and of
    /// [`crate::compressed::Inflater::begin`] (a peek at a request's first bytes that the
    /// whole request then goes on from counts once).
    pub decompressions: u64,
}

#[cfg(feature = "parse-counters")]
mod imp {
    use std::cell::Cell;

    use super::Counts;

    thread_local! {
        static HEADERS: Cell<u64> = const { Cell::new(0) };
        static DECOMPRESSIONS: Cell<u64> = const { Cell::new(0) };
    }

    #[inline]
    pub(crate) fn header_parsed() {
        HEADERS.with(|c| c.set(c.get() + 1));
    }

    #[inline]
    pub(crate) fn decompressed() {
        DECOMPRESSIONS.with(|c| c.set(c.get() + 1));
    }

    /// This thread's counts (a test on a current-thread runtime sees its sessions' work).
    pub fn counts() -> Counts {
        Counts {
            header_parses: HEADERS.with(Cell::get),
            decompressions: DECOMPRESSIONS.with(Cell::get),
        }
    }
}

#[cfg(feature = "parse-counters")]
pub use imp::counts;
#[cfg(feature = "parse-counters")]
pub(crate) use imp::{decompressed, header_parsed};

#[cfg(not(feature = "parse-counters"))]
#[inline(always)]
pub(crate) fn header_parsed() {}

#[cfg(not(feature = "parse-counters"))]
#[inline(always)]
pub(crate) fn decompressed() {}
