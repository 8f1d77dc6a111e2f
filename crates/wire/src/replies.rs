//! Framing where a large message need not be held whole: a reply that nothing inspects can
//! go on to the client in pieces as they arrive, so a client that does not read it leaves
//! the rest in mongos's socket (push-back) instead of in our memory; likewise a request that
//! nothing inspects goes on to mongos in pieces, so a mongos that does not read (one serving
//! an awaitable `hello` on that connection) leaves the rest in the client's socket.
//!
//! ```text
//! small message ─────────────────────────────► Incoming::Message (whole, as MessageCodec)
//! large message ─► Incoming::Large (head) ─► stream(true)  ─► Piece … Piece, Last
//!                                         └─► stream(false) ─► Incoming::Message (whole)
//! ```
//!
//! The caller answers each [`Incoming::Large`] with [`StreamCodec::stream`] before it reads
//! on; a decoder left without an answer reads the message whole. When the head is offered,
//! the read buffer starts with the message's first [`StreamCodec::head_len`] bytes (or all
//! of it), nothing consumed: what the caller needs to decide.

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

use crate::codec::{FrameError, MessageCodec};
use crate::opmsg::MORE_TO_COME;
use crate::{read_i32, read_u32, Header, OpCode, HEADER_LEN};

/// Room kept for a streamed message's pieces: each read takes at most this much.
pub const PIECE_ROOM: usize = 64 * 1024;

/// What the upstream side reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A whole message.
    Message(Bytes),
    /// The head of a message larger than the streaming threshold; nothing consumed yet.
    Large(Head),
    /// The next bytes of a streamed message (the first piece starts with its header).
    Piece(Bytes),
    /// The last bytes of a streamed message, and whether its head said more to come.
    Last { bytes: Bytes, more_to_come: bool },
}

/// What the head of a large message says: enough to decide whether it must be inspected
/// (which request it answers) and what it means for the relay (more to come).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub header: Header,
    /// The OP_MSG flag bits (0 for other opcodes, whose flags are not read here).
    pub flags: u32,
}

impl Head {
    /// An OP_MSG with `moreToCome`: an exhaust stream goes on after it.
    pub fn more_to_come(&self) -> bool {
        self.flags & MORE_TO_COME != 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between messages, or inside a message read whole.
    Framing,
    /// A [`Incoming::Large`] went out; waiting for [`StreamCodec::stream`].
    Asking { len: usize, more: bool },
    /// The caller said stream: this many bytes of the message are still to come.
    Streaming { left: usize, more: bool },
    /// The caller said whole (or did not answer): frame it as a plain message.
    Whole,
}

/// [`MessageCodec`] for messages up to `stream_above` bytes; larger ones are offered for
/// streaming first.
#[derive(Debug, Clone)]
pub struct StreamCodec {
    inner: MessageCodec,
    stream_above: usize,
    /// Bytes of a large message's start that must be there before it is offered.
    head_len: usize,
    state: State,
}

/// The bytes a request's head is offered with: the header and what an OP_MSG's command
/// name is read from (`body::command_name_in_prefix`).
pub const REQUEST_HEAD: usize = HEADER_LEN + crate::body::COMMAND_PREFIX;

impl StreamCodec {
    /// For the upstream side (mongos, trusted: room for a message read whole is made at
    /// its declared size); replies larger than `stream_above` are offered once their header
    /// and flags are there.
    pub fn replies(max_message_size: usize, stream_above: usize) -> Self {
        StreamCodec {
            inner: MessageCodec::trusting(max_message_size),
            stream_above: stream_above.max(REQUEST_HEAD),
            head_len: HEAD_LEN,
            state: State::Framing,
        }
    }

    /// For the client side (untrusted: a message read whole grows with what arrives);
    /// requests larger than `stream_above` are offered once [`REQUEST_HEAD`] bytes are
    /// there.
    pub fn requests(max_message_size: usize, stream_above: usize) -> Self {
        StreamCodec {
            inner: MessageCodec::new(max_message_size),
            stream_above: stream_above.max(REQUEST_HEAD),
            head_len: REQUEST_HEAD,
            state: State::Framing,
        }
    }

    /// How many bytes of a large message's start the read buffer holds when it is offered
    /// (fewer only when the message is shorter).
    pub fn head_len(&self) -> usize {
        self.head_len
    }

    /// The decoder a message read whole goes through.
    pub fn framing(&self) -> &MessageCodec {
        &self.inner
    }

    /// The answer to the last [`Incoming::Large`]: `true` streams it in pieces, `false`
    /// reads it whole.
    pub fn stream(&mut self, yes: bool) {
        if let State::Asking { len, more } = self.state {
            self.state = if yes {
                State::Streaming { left: len, more }
            } else {
                State::Whole
            };
        }
    }

    /// A large message is offered (not answered yet) or being read whole.
    pub fn holds_whole(&self) -> bool {
        matches!(self.state, State::Asking { .. } | State::Whole)
    }

    /// A large message is under way (offered, streamed or read whole). A message being
    /// framed is under way when the read buffer is not empty.
    pub fn in_large(&self) -> bool {
        !matches!(self.state, State::Framing)
    }

    /// The room `codec::reclaim` takes back between messages; `None` while a large message
    /// is under way, or when the allocation is a large message's.
    pub fn reclaim_room(&self) -> Option<usize> {
        match self.state {
            State::Framing => self.inner.reclaim_room(),
            _ => None,
        }
    }

    /// The connection went idle: the framing keeps only the small room between messages
    /// (see `MessageCodec::idle`).
    pub fn idle(&mut self) {
        self.inner.idle();
    }

    /// A streamed message is under way: nothing else may be queued for the same peer until
    /// its last piece.
    pub fn is_streaming(&self) -> bool {
        matches!(self.state, State::Streaming { .. })
    }

    /// A message of `declared` bytes is one to offer (out of bounds lengths are the framing
    /// decoder's to refuse).
    fn is_large(&self, declared: i32) -> bool {
        declared >= 0
            && declared as usize > self.stream_above
            && declared as usize <= self.inner.max()
    }

    /// The head of a message larger than `stream_above`, once its first `head_len` bytes
    /// are there.
    fn large_head(&self, src: &[u8]) -> Option<Head> {
        let declared = i32::from_le_bytes(src.get(..4)?.try_into().ok()?);
        if !self.is_large(declared) || src.len() < self.head_len {
            return None;
        }
        // Read here without `Header::parse`: a message is opened once, by whoever gets it.
        let header = Header {
            length: declared,
            request_id: read_i32(src, 4)?,
            response_to: read_i32(src, 8)?,
            op_code: read_i32(src, 12)?,
        };
        let flags = match header.op_code {
            OpCode::MSG => read_u32(src, HEADER_LEN)?,
            _ => 0,
        };
        Some(Head { header, flags })
    }
}

/// The bytes a head is read from: the header and the OP_MSG flags.
const HEAD_LEN: usize = HEADER_LEN + 4;

impl Decoder for StreamCodec {
    type Item = Incoming;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Incoming>, FrameError> {
        match self.state {
            State::Framing => {
                if src.len() >= 4 && src.len() < self.head_len {
                    let declared = i32::from_le_bytes([src[0], src[1], src[2], src[3]]);
                    if self.is_large(declared) {
                        // Wait for the head before making room for a message that may
                        // never be held whole (the buffer grows with what arrives).
                        if src.capacity() == src.len() {
                            src.reserve(self.head_len - src.len());
                        }
                        return Ok(None);
                    }
                } else if let Some(head) = self.large_head(src) {
                    self.state = State::Asking {
                        len: head.header.length as usize,
                        more: head.more_to_come(),
                    };
                    return Ok(Some(Incoming::Large(head)));
                }
                Ok(self.inner.decode(src)?.map(Incoming::Message))
            }
            State::Asking { .. } | State::Whole => {
                let msg = self.inner.decode(src)?;
                if msg.is_some() {
                    self.state = State::Framing;
                }
                Ok(msg.map(Incoming::Message))
            }
            State::Streaming { left, more } => {
                if src.is_empty() {
                    self.inner.ready_for(src, PIECE_ROOM);
                    return Ok(None);
                }
                let n = left.min(src.len());
                let piece = src.split_to(n).freeze();
                if n == left {
                    self.state = State::Framing;
                    // The pieces' buffer is not kept between messages either.
                    self.inner.shrink_next();
                    return Ok(Some(Incoming::Last {
                        bytes: piece,
                        more_to_come: more,
                    }));
                }
                self.state = State::Streaming {
                    left: left - n,
                    more,
                };
                Ok(Some(Incoming::Piece(piece)))
            }
        }
    }
}
