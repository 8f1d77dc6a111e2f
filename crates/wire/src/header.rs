//! The 16-byte message header and the opcodes.

use bytes::BufMut;

use super::read_i32;

pub const HEADER_LEN: usize = 16;

/// Opcodes this proxy tells apart; anything else is relayed as an opaque frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    Reply,
    Query,
    Compressed,
    Msg,
    Other(i32),
}

impl OpCode {
    pub const REPLY: i32 = 1;
    pub const QUERY: i32 = 2004;
    pub const COMPRESSED: i32 = 2012;
    pub const MSG: i32 = 2013;

    pub fn from_i32(v: i32) -> OpCode {
        match v {
            Self::REPLY => OpCode::Reply,
            Self::QUERY => OpCode::Query,
            Self::COMPRESSED => OpCode::Compressed,
            Self::MSG => OpCode::Msg,
            other => OpCode::Other(other),
        }
    }

    pub fn as_i32(self) -> i32 {
        match self {
            OpCode::Reply => Self::REPLY,
            OpCode::Query => Self::QUERY,
            OpCode::Compressed => Self::COMPRESSED,
            OpCode::Msg => Self::MSG,
            OpCode::Other(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub length: i32,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
}

impl Header {
    /// Reads the header at the front of a message; `None` if fewer than 16 bytes.
    #[inline]
    pub fn parse(msg: &[u8]) -> Option<Header> {
        crate::counters::header_parsed();
        Some(Header {
            length: read_i32(msg, 0)?,
            request_id: read_i32(msg, 4)?,
            response_to: read_i32(msg, 8)?,
            op_code: read_i32(msg, 12)?,
        })
    }

    #[inline]
    pub fn op(&self) -> OpCode {
        OpCode::from_i32(self.op_code)
    }

    pub fn put(&self, out: &mut impl BufMut) {
        out.put_i32_le(self.length);
        out.put_i32_le(self.request_id);
        out.put_i32_le(self.response_to);
        out.put_i32_le(self.op_code);
    }
}
