//! Length-prefixed framing: one item is one whole message, header included, as `Bytes`
//! split off the read buffer (no copy).

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

use super::{WireError, HEADER_LEN};

#[derive(Debug, Clone)]
pub struct MessageCodec {
    max: usize,
}

impl MessageCodec {
    pub fn new(max_message_size: usize) -> Self {
        MessageCodec {
            max: max_message_size.max(HEADER_LEN),
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
            if src.capacity() < len {
                // Exactly one frame's room: `reserve` may double, which for a frame near the
                // bound would allocate twice the declared maximum.
                let mut room = BytesMut::with_capacity(len);
                room.extend_from_slice(src);
                *src = room;
            }
            return Ok(None);
        }
        Ok(Some(src.split_to(len).freeze()))
    }
}
