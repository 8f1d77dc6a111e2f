//! OP_COMPRESSED (2012): the wrapped message is decompressed for inspection only; the
//! original bytes are what gets forwarded unless a rewrite is the point.

use std::io::Read;

use super::{read_i32, OpCode, WireError};

pub const NOOP: u8 = 0;
pub const SNAPPY: u8 = 1;
pub const ZLIB: u8 = 2;
pub const ZSTD: u8 = 3;

/// The fixed part of an OP_COMPRESSED payload (the bytes after the header).
#[derive(Debug, Clone, Copy)]
pub struct Compressed<'a> {
    pub original_opcode: i32,
    pub uncompressed_size: i32,
    pub compressor: u8,
    pub data: &'a [u8],
}

impl<'a> Compressed<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Compressed<'a>, WireError> {
        if payload.len() < 9 {
            return Err(WireError::Truncated("op_compressed"));
        }
        let original_opcode = read_i32(payload, 0).ok_or(WireError::Truncated("op_compressed"))?;
        let uncompressed_size =
            read_i32(payload, 4).ok_or(WireError::Truncated("op_compressed"))?;
        if matches!(original_opcode, OpCode::COMPRESSED) {
            return Err(WireError::BadInnerOpcode(original_opcode));
        }
        let compressor = payload[8];
        if compressor > ZSTD {
            return Err(WireError::UnknownCompressor(compressor));
        }
        Ok(Compressed {
            original_opcode,
            uncompressed_size,
            compressor,
            data: &payload[9..],
        })
    }

    /// Decompresses the wrapped payload, refusing anything whose declared size exceeds `max`
    /// and anything that does not decompress to exactly the declared size.
    pub fn decompress(&self, max: usize) -> Result<Vec<u8>, WireError> {
        crate::counters::decompressed();
        let declared = self.uncompressed_size;
        if declared < 0 || declared as i64 > max as i64 {
            return Err(WireError::BadLength {
                len: declared as i64,
                max,
            });
        }
        let want = declared as usize;
        let out = match self.compressor {
            NOOP => self.data.to_vec(),
            SNAPPY => {
                let n = snappy_len(self.data)?;
                if n != want {
                    return Err(WireError::SizeMismatch {
                        declared: declared as i64,
                        actual: n,
                    });
                }
                snap::raw::Decoder::new()
                    .decompress_vec(self.data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?
            }
            ZLIB => read_bounded(
                flate2::read::ZlibDecoder::new(self.data),
                want,
                self.data.len(),
            )?,
            ZSTD => {
                let dec = zstd::stream::read::Decoder::with_buffer(self.data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?;
                read_bounded(dec, want, self.data.len())?
            }
            other => return Err(WireError::UnknownCompressor(other)),
        };
        if out.len() != want {
            return Err(WireError::SizeMismatch {
                declared: declared as i64,
                actual: out.len(),
            });
        }
        Ok(out)
    }
}

/// The most snappy can expand: a 3-byte copy tag yields at most 64 bytes (and the stream
/// starts with its length as a varint of up to 5 bytes).
pub const SNAPPY_MAX_RATIO: usize = 22;

/// The decompressed length a snappy block states, refused when its own format could not
/// produce it from this input (the decoder would allocate and zero it before failing).
fn snappy_len(data: &[u8]) -> Result<usize, WireError> {
    let n = snap::raw::decompress_len(data).map_err(|e| WireError::Decompress(e.to_string()))?;
    if n > data.len().saturating_mul(SNAPPY_MAX_RATIO) {
        return Err(WireError::Decompress(format!(
            "snappy block states {n} bytes from {} compressed: more than snappy can expand",
            data.len()
        )));
    }
    Ok(n)
}

impl Compressed<'_> {
    /// The first `n` bytes of the wrapped payload (fewer when it is shorter), decompressing
    /// no further than that for zlib and zstd: reading a command name must not cost the
    /// whole message. Snappy blocks are decompressed whole (bounded by snappy's own ratio,
    /// [`SNAPPY_MAX_RATIO`]) and cut.
    pub fn decompress_prefix(&self, n: usize) -> Result<Vec<u8>, WireError> {
        let declared = self.uncompressed_size;
        if declared < 0 {
            return Err(WireError::BadLength {
                len: declared as i64,
                max: n,
            });
        }
        let n = n.min(declared as usize);
        let mut out = match self.compressor {
            NOOP => self.data[..n.min(self.data.len())].to_vec(),
            SNAPPY => {
                snappy_len(self.data)?;
                snap::raw::Decoder::new()
                    .decompress_vec(self.data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?
            }
            ZLIB => read_bounded(flate2::read::ZlibDecoder::new(self.data), n, 0)?,
            ZSTD => {
                let dec = zstd::stream::read::Decoder::with_buffer(self.data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?;
                read_bounded(dec, n, 0)?
            }
            other => return Err(WireError::UnknownCompressor(other)),
        };
        out.truncate(n);
        Ok(out)
    }
}

/// Reads a decompressing stream to its end, at most `want + 1` bytes. The first allocation
/// is sized from the compressed input, not from the peer's declared size, so a tiny message
/// cannot make us allocate the maximum up front.
fn read_bounded(r: impl Read, want: usize, compressed_len: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(want.min(compressed_len.saturating_mul(8) + 4096));
    r.take(want as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| WireError::Decompress(e.to_string()))?;
    Ok(out)
}

/// Compresses `data` with the given compressor id (used when a rewrite must be re-wrapped).
pub fn compress(compressor: u8, data: &[u8]) -> Result<Vec<u8>, WireError> {
    match compressor {
        NOOP => Ok(data.to_vec()),
        SNAPPY => snap::raw::Encoder::new()
            .compress_vec(data)
            .map_err(|e| WireError::Decompress(e.to_string())),
        ZLIB => {
            use std::io::Write;
            let mut enc =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(data)
                .and_then(|_| enc.finish())
                .map_err(|e| WireError::Decompress(e.to_string()))
        }
        ZSTD => zstd::bulk::compress(data, 1).map_err(|e| WireError::Decompress(e.to_string())),
        other => Err(WireError::UnknownCompressor(other)),
    }
}
