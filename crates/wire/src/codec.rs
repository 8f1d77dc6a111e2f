//! Length-prefixed framing: one item is one whole message, header included, as `Bytes`
//! split off the read buffer (no copy). After a message larger than [`SHRINK_AFTER`] the
//! read buffer goes back to its small default, so a connection does not keep the largest
//! message it ever carried.

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

use super::{WireError, HEADER_LEN};

/// The least room the decoder leaves for a partial frame (drivers' messages are mostly far
/// smaller; bigger frames get exactly their size), and the room kept between messages once
/// a connection has carried a message larger than [`SMALL_ROOM`].
const MIN_ROOM: usize = 8 * 1024;

/// The room a connection keeps between messages until one of its messages does not fit in
/// it (and again after it went idle, [`MessageCodec::idle`]): finds, pings, hellos and their
/// replies of a few hundred bytes take one read each, and a connection pair that carries
/// only those holds 2 KiB of read buffers instead of 16 (what glibc keeps of them once they
/// are let go is most of an idle pair's memory).
pub const SMALL_ROOM: usize = 1024;

/// A message larger than this leaves the read buffer on a large allocation; the next time
/// the decoder waits for bytes, it moves what has arrived of the next message to a buffer of
/// the usual room and lets the large one go. So an idle connection keeps at most this much
/// per direction (drivers' requests are far smaller; the fresh buffer after a larger
/// message costs one small allocation, next to a message of more than 16 KiB).
pub const SHRINK_AFTER: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct MessageCodec {
    max: usize,
    /// Make room for a whole declared frame at once (for a peer we trust: the upstream
    /// mongos), instead of growing with the bytes received (for clients).
    trust_declared: bool,
    /// The read buffer's allocation is one a message larger than [`SHRINK_AFTER`] needed.
    shrink_due: bool,
    /// The room kept between messages: [`SMALL_ROOM`], or [`MIN_ROOM`] once a message did
    /// not fit in it.
    room: usize,
}

impl MessageCodec {
    /// For an untrusted peer: a partial frame holds at most about twice what has arrived.
    pub fn new(max_message_size: usize) -> Self {
        MessageCodec {
            max: max_message_size.max(HEADER_LEN),
            trust_declared: false,
            shrink_due: false,
            room: SMALL_ROOM,
        }
    }

    /// For a trusted peer (mongos): room for the declared frame once its header arrives, so
    /// a large reply is read into one allocation without regrowth copies.
    pub fn trusting(max_message_size: usize) -> Self {
        MessageCodec {
            trust_declared: true,
            ..MessageCodec::new(max_message_size)
        }
    }
}

impl MessageCodec {
    /// The largest message accepted.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Between two reads with nothing of a message in `src`: room for `room` bytes, on a
    /// fresh allocation when the present one is a large message's.
    pub(crate) fn ready_for(&mut self, src: &mut BytesMut, room: usize) {
        if self.shrink_due {
            self.make_room(src, room);
        } else if src.capacity() < room / 2 {
            src.reserve(room);
        }
    }

    /// The room [`reclaim`] takes back between messages; `None` when the allocation is a
    /// large message's (it goes at the next wait instead).
    pub fn reclaim_room(&self) -> Option<usize> {
        (!self.shrink_due).then(|| self.room.min(self.max))
    }

    /// The connection went idle: the room kept between messages goes back to
    /// [`SMALL_ROOM`] (a connection that carried one large message does not keep 8 KiB).
    pub fn idle(&mut self) {
        self.room = SMALL_ROOM;
    }

    /// The buffer now holds a large allocation (a streamed message's pieces): the next wait
    /// between messages lets it go.
    pub(crate) fn shrink_next(&mut self) {
        self.shrink_due = true;
    }

    /// Leaves `src` with at least `room` bytes of capacity for the message it holds the
    /// start of, on a fresh allocation of exactly `room` when it must grow or when its
    /// allocation is a large message's.
    fn make_room(&mut self, src: &mut BytesMut, room: usize) {
        if self.shrink_due || src.capacity() < room {
            let mut fresh = BytesMut::with_capacity(room);
            fresh.extend_from_slice(src);
            *src = fresh;
            self.shrink_due = false;
        }
    }
}

/// Between messages, once no frame split off `src` is alive any more: its allocation taken
/// back whole for `room` bytes (no allocation, no copy), so that the next message is read
/// into it. A request a followed read keeps alive until its reply is alive still when the
/// decoder next waits for bytes, and [`Decoder::decode`] then takes a fresh buffer; taken
/// back after the reply instead, one allocation serves every request.
pub fn reclaim(src: &mut BytesMut, room: Option<usize>) {
    if let Some(room) = room {
        if src.is_empty() && src.capacity() < room {
            // False (nothing done) while a frame is alive.
            let _ = src.try_reclaim(room);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Decoder for MessageCodec {
    type Item = Bytes;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        if src.is_empty() {
            // Between messages: make sure the next read has room for a whole small message.
            // Left alone, the buffer keeps only what the last frame left behind (nothing,
            // when a frame filled it exactly), `FramedRead` asks for one byte, and a 333-byte
            // request then takes a 1-byte read, a 7-byte read, the rest, and a read that
            // fails with EAGAIN (a read that fills the buffer exactly cannot tell tokio the
            // socket is drained). `reserve` on an empty buffer takes back its own allocation
            // when no frame from it is alive; otherwise it allocates MIN_ROOM (or the maximum
            // message size when smaller), or the size class of the buffer's first allocation
            // when larger (bytes caps that at 64 KiB).
            // After a large message, never `reserve`: it would take the large allocation
            // back once the message is dropped, and keep it for the connection's life.
            self.ready_for(src, self.room.min(self.max));
            return Ok(None);
        }
        if src.len() < 4 {
            return Ok(None);
        }
        let declared = i32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        // Checked as a signed value before any cast, so a negative length is never huge.
        if declared < HEADER_LEN as i32 || declared as i64 > self.max as i64 {
            return Err(WireError::BadLength {
                len: declared as i64,
                max: self.max,
            }
            .into());
        }
        let len = declared as usize;
        if src.len() < len {
            if len > self.room {
                // This connection carries messages larger than the small room: from now
                // on (until it goes idle) keep the usual room between them.
                self.room = MIN_ROOM;
            }
            // Grow with what the peer has actually sent, never with what it declares: a
            // header alone must not make us hold the declared size (an untrusted port can
            // open many connections that each declare the maximum and then trickle). The
            // room at most doubles what has arrived (at least MIN_ROOM, so small frames
            // need one allocation and no EAGAIN read), and never exceeds the frame. Never
            // `BytesMut::reserve`, whose own doubling is not bounded by the frame.
            // While the buffer still has room for a read (`MIN_ROOM`, or the rest of the
            // frame), it is left as it is: grown at every read, a frame arriving in small
            // reads (a trickling client, or the 32 KiB receives of `layout = "uring"`)
            // would be copied whole at each one, quadratic in its size; grown only once
            // full, it doubles, and each byte is copied a bounded number of times.
            let missing = len - src.len();
            let spare = src.capacity() - src.len();
            if !self.trust_declared && !self.shrink_due && spare >= missing.min(MIN_ROOM) {
                return Ok(None);
            }
            let room = if self.trust_declared {
                len.max(MIN_ROOM).min(self.max.max(len))
            } else {
                len.min(MIN_ROOM.max(src.len().saturating_mul(2)))
            };
            self.make_room(src, room);
            return Ok(None);
        }
        if len > SHRINK_AFTER {
            self.shrink_due = true;
        }
        Ok(Some(src.split_to(len).freeze()))
    }
}
