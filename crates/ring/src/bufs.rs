//! The ring's provided receive buffers: `COUNT` buffers of `SIZE` bytes in one allocation,
//! offered to the kernel through a registered buffer ring (`IORING_REGISTER_PBUF_RING`).
//! A receive picks a free buffer only when bytes arrive, so an idle socket pins none; the
//! driver copies the bytes out into the socket's own inbox at the completion and hands the
//! buffer straight back ([`BufRing::give_back`]), so a socket whose session does not read
//! pins none either.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::IoUring;

/// The buffer group id of the one buffer ring.
pub(crate) const GROUP: u16 = 0;
/// Bytes per buffer: one receive takes at most this many.
pub(crate) const SIZE: usize = 32 * 1024;
/// Buffers per ring (a power of two). Pages are touched only when a receive lands in them.
pub(crate) const COUNT: u16 = 256;

/// The registered ring of buffer descriptors and the buffers themselves.
pub(crate) struct BufRing {
    /// `count` entries, page-aligned, shared with the kernel (it reads entries up to the
    /// tail we publish, and moves its head).
    entries: *mut BufRingEntry,
    /// `count * SIZE` bytes: buffer `i` is `data[i * SIZE..][..SIZE]`.
    data: *mut u8,
    /// Our tail: the next entry to fill.
    tail: u16,
    /// How many buffers: [`COUNT`], but fewer in tests that starve the ring.
    count: u16,
}

fn entries_layout(count: u16) -> Layout {
    // 16 bytes per entry; the kernel wants the ring page-aligned.
    Layout::from_size_align(count as usize * std::mem::size_of::<BufRingEntry>(), 4096)
        .expect("buffer ring layout")
}

fn data_layout(count: u16) -> Layout {
    Layout::from_size_align(count as usize * SIZE, 4096).expect("buffer layout")
}

impl BufRing {
    /// Allocates `count` buffers (a power of two), registers the ring with `ring` and offers
    /// every buffer.
    pub(crate) fn register(ring: &IoUring, count: u16) -> io::Result<BufRing> {
        assert!(
            count.is_power_of_two(),
            "a buffer ring's size is a power of two"
        );
        let (entries_layout, data_layout) = (entries_layout(count), data_layout(count));
        // SAFETY: both layouts have a non-zero size.
        let entries = unsafe { alloc_zeroed(entries_layout) }.cast::<BufRingEntry>();
        // SAFETY: as above. Not zeroed: zeroing would touch every page (8 MiB per thread
        // resident at start); untouched, a page becomes resident only when a receive lands in
        // it, and only the bytes a receive wrote are ever read.
        let data = unsafe { alloc(data_layout) };
        if entries.is_null() || data.is_null() {
            // SAFETY: each pointer freed here came from the allocator with its layout.
            unsafe {
                if !entries.is_null() {
                    dealloc(entries.cast(), entries_layout);
                }
                if !data.is_null() {
                    dealloc(data, data_layout);
                }
            }
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "io_uring receive buffers",
            ));
        }
        let mut bufs = BufRing {
            entries,
            data,
            tail: 0,
            count,
        };
        // SAFETY: `entries` holds `count` entries and lives until `self` is dropped, which
        // the owner does only after the ring itself is gone (`Driver`'s field order and
        // `Driver::stop`), so the kernel never reads a freed ring.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(entries as u64, count, GROUP, 0)?;
        }
        for bid in 0..count {
            bufs.give_back(bid);
        }
        Ok(bufs)
    }

    /// The first `len` bytes of buffer `bid`, which a completion just handed to us.
    pub(crate) fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let (bid, len) = ((bid & (self.count - 1)) as usize, len.min(SIZE));
        // SAFETY: the range is inside `data`; the kernel wrote buffer `bid` before posting
        // the completion that named it and does not touch it again until `give_back(bid)`.
        unsafe { std::slice::from_raw_parts(self.data.add(bid * SIZE), len) }
    }

    /// Offers buffer `bid` to the kernel again.
    pub(crate) fn give_back(&mut self, bid: u16) {
        let bid = bid & (self.count - 1);
        let slot = (self.tail & (self.count - 1)) as usize;
        // SAFETY: `slot < count`; the kernel reads only entries below the published tail,
        // and this one is at the tail, so nobody else reads it while we write it. A buffer
        // is given back once per completion that took it, so at most `count` are offered.
        unsafe {
            let e = &mut *self.entries.add(slot);
            e.set_addr(self.data.add(bid as usize * SIZE) as u64);
            e.set_len(SIZE as u32);
            e.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail is the u16 the kernel reads inside the first entry; it is
        // aligned and lives as long as `entries`. Release: the entry above is written first.
        unsafe {
            let tail = BufRingEntry::tail(self.entries).cast_mut();
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: both came from the allocator with these layouts; the ring that used them
        // is closed and drained, or this is never dropped (`Driver::stop` leaks it).
        unsafe {
            dealloc(self.entries.cast(), entries_layout(self.count));
            dealloc(self.data, data_layout(self.count));
        }
    }
}
